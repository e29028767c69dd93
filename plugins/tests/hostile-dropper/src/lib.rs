//! A dropper that misbehaves on purpose, for the host's containment tests.
//! `configure(mode=...)`: keep (drops nothing), unrouted, out-of-range,
//! all, duplicate, trap, loop, grow.

use std::cell::RefCell;

use bmoe::policy::types::Info;
use exports::bmoe::policy::dropper_policy::{Guest, Routed};

wit_bindgen::generate!({ world: "dropper", path: "../../wit" });

struct Hostile;

thread_local! {
    static MODE: RefCell<String> = RefCell::new(String::from("keep"));
}

impl Guest for Hostile {
    fn describe() -> Info {
        Info {
            name: "hostile-dropper".into(),
            version: "0.0.1".into(),
            description: "test fixture: keep, unrouted, out-of-range, all, duplicate, trap, loop, grow".into(),
            params: Vec::new(),
        }
    }

    fn configure(params: Vec<(String, String)>) -> Result<(), String> {
        for (k, v) in params {
            if k == "mode" {
                MODE.with_borrow_mut(|m| *m = v);
            }
        }
        Ok(())
    }

    fn decide(_layer: u32, _k: u32, slots: Vec<Routed>) -> Vec<u32> {
        let experts: Vec<u32> = slots.iter().map(|s| s.expert).collect();
        let mode = MODE.with_borrow(|m| m.clone());
        match mode.as_str() {
            // An expert id that exists but was not routed for this token.
            "unrouted" => vec![(0..).find(|e| !experts.contains(e)).unwrap_or(0)],
            "out-of-range" => vec![100_000],
            "all" => experts,
            "duplicate" => vec![experts[experts.len() - 1]; 2],
            "trap" => unreachable!("a trap on purpose"),
            "loop" => loop {
                std::hint::black_box(());
            },
            "grow" => grow_forever(),
            _ => Vec::new(),
        }
    }
}

/// A memory bomb that reaches any cap in a few steps: it grows linear memory
/// 16 MiB at a time without touching it, so it uses almost no CPU time and
/// the memory limit is the only one it can hit.
fn grow_forever() -> ! {
    loop {
        core::arch::wasm32::memory_grow::<0>(256);
    }
}

export!(Hostile);
