//! `drop-cold`: the reference engine's cache-aware drop rule. A routed expert
//! is dropped only when all three hold: its bytes are not resident (a cache
//! miss), its router weight is below `F / k` ("F of the uniform share"), and
//! it is not the expert with the largest weight. The host renormalizes the
//! survivors.

use std::cell::Cell;

use exports::bmoe::policy::dropper_policy::Guest;
use bmoe::policy::types::{Info, Param};

wit_bindgen::generate!({ world: "dropper", path: "../wit" });

struct DropCold;

thread_local! {
    static F: Cell<f32> = const { Cell::new(0.75) };
}

impl Guest for DropCold {
    fn describe() -> Info {
        Info {
            name: "drop-cold".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "drop a routed expert that is a cache miss with weight below F/k (never the top one)".into(),
            params: vec![Param {
                name: "F".into(),
                default: "0.75".into(),
                description: "threshold as a fraction of the uniform share 1/k, in [0, 1]".into(),
            }],
        }
    }

    fn configure(params: Vec<(String, String)>) -> Result<(), String> {
        let mut f = F.get();
        support::apply(&params, |name, value| {
            if name != "F" {
                return Ok(false);
            }
            f = support::parse(name, value)?;
            Ok(true)
        })?;
        if !(0.0..=1.0).contains(&f) {
            return Err(format!("F must be in [0, 1] (got {f})"));
        }
        F.set(f);
        Ok(())
    }

    fn decide(_layer: u32, experts: Vec<u32>, weights: Vec<f32>, resident: Vec<bool>, k: u32) -> Vec<u32> {
        if experts.is_empty() || k == 0 {
            return Vec::new();
        }
        let threshold = F.get() / k as f32;
        // The first expert with the largest weight is never dropped.
        let mut top = 0;
        for (i, w) in weights.iter().enumerate() {
            if *w > weights[top] {
                top = i;
            }
        }
        let mut dropped = Vec::new();
        for (i, &e) in experts.iter().enumerate() {
            let cold = !resident.get(i).copied().unwrap_or(true);
            if i != top && cold && weights.get(i).is_some_and(|&w| w < threshold) && !dropped.contains(&e) {
                dropped.push(e);
            }
        }
        dropped
    }
}

export!(DropCold);
