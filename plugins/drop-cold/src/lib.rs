//! `drop-cold`: the reference engine's cache-aware drop rule. A routed expert
//! is dropped only when all three hold: its bytes are not resident (a cache
//! miss), its router weight is below `F / k` ("F of the uniform share"), and
//! it is not the expert with the largest weight. The host renormalizes the
//! survivors.

use std::cell::Cell;

use bmoe::policy::types::{Info, Param};
use exports::bmoe::policy::dropper_policy::{Guest, Routed};

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

    fn decide(_layer: u32, k: u32, slots: Vec<Routed>) -> Vec<u32> {
        if slots.is_empty() || k == 0 {
            return Vec::new();
        }
        let threshold = F.get() / k as f32;
        // The first slot with the largest weight is never dropped.
        let mut top = 0;
        for (i, s) in slots.iter().enumerate() {
            if s.weight > slots[top].weight {
                top = i;
            }
        }
        let mut dropped = Vec::new();
        for (i, s) in slots.iter().enumerate() {
            if i != top && !s.resident && s.weight < threshold && !dropped.contains(&s.expert) {
                dropped.push(s.expert);
            }
        }
        dropped
    }
}

export!(DropCold);
