//! A drafter that misbehaves on purpose, for the host's containment tests.
//! `configure(mode=...)` picks the fault; until then it drafts nothing.

use std::cell::RefCell;

use bmoe::policy::types::Info;
use exports::bmoe::policy::drafter_policy::Guest;

wit_bindgen::generate!({ world: "drafter", path: "../../wit" });

struct Hostile;

thread_local! {
    static MODE: RefCell<String> = RefCell::new(String::from("idle"));
}

fn mode() -> String {
    MODE.with_borrow(|m| m.clone())
}

impl Guest for Hostile {
    fn describe() -> Info {
        Info {
            name: "hostile-drafter".into(),
            version: "0.0.1".into(),
            description: "test fixture: loop, grow, trap, huge, oov, negative, idle, or a valid echo".into(),
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

    fn reset(_context: Vec<i32>) {
        if mode() == "loop-reset" {
            #[allow(clippy::empty_loop)]
            loop {}
        }
    }

    fn observe(_accepted: Vec<i32>) {}

    fn draft(max: u32) -> Vec<i32> {
        match mode().as_str() {
            "loop" => loop {
                std::hint::black_box(());
            },
            "grow" => grow_forever(),
            "trap" => unreachable!("a trap on purpose"),
            "huge" => vec![0; max as usize + 1000],
            "oov" => vec![1_000_000],
            "negative" => vec![-5],
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
