//! A drafter built against bmoe:policy@1.0.0, which bmoe 0.1 must refuse.

use exports::bmoe::policy::drafter_policy::Guest;

wit_bindgen::generate!({ world: "drafter", path: "wit" });

struct Future;

impl Guest for Future {
    fn draft(_max: u32) -> Vec<i32> {
        Vec::new()
    }
}

export!(Future);
