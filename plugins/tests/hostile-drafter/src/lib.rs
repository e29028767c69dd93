//! A drafter that misbehaves on purpose, for the host's containment tests.
//! `configure(mode=...)` picks the fault; until then it drafts nothing.

use std::cell::RefCell;

use bmoe::policy::types::Info;
use exports::bmoe::policy::drafter_policy::Guest;

wit_bindgen::generate!({ world: "drafter", path: "../../wit" });

struct Hostile;

thread_local! {
    static MODE: RefCell<String> = RefCell::new(String::from("idle"));
    static HOARD: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
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
            "grow" => loop {
                HOARD.with_borrow_mut(|h| h.push(vec![1u8; 1 << 20]));
            },
            "trap" => unreachable!("a trap on purpose"),
            "huge" => vec![0; max as usize + 1000],
            "oov" => vec![1_000_000],
            "negative" => vec![-5],
            _ => Vec::new(),
        }
    }
}

export!(Hostile);
