//! The engine's side of a policy: every answer is validated, and the first
//! fault or invalid answer disables the policy for the rest of the run with
//! one message naming the policy and the fault. A disabled drafter drafts
//! nothing and a disabled dropper drops nothing, so decoding continues
//! exactly as without the policy.

use std::collections::HashSet;

use super::{DraftPolicy, DropCall, DropPolicy};

/// Whether a policy is still trusted; the first fault disables it for good
/// and leaves one message for the front end.
struct Health {
    /// `draft plugin` or `drop plugin`.
    what: &'static str,
    name: String,
    disabled: Option<String>,
    notice: Option<String>,
}

impl Health {
    fn new(what: &'static str, name: &str) -> Health {
        Health { what, name: name.to_string(), disabled: None, notice: None }
    }

    fn ok(&self) -> bool {
        self.disabled.is_none()
    }

    fn disable(&mut self, fault: String) {
        let msg = format!("{} `{}` disabled for the rest of the run: {fault}", self.what, self.name);
        self.notice = Some(msg.clone());
        self.disabled = Some(msg);
    }
}

/// A guarded draft policy.
pub struct Drafter {
    health: Health,
    inner: Box<dyn DraftPolicy>,
    n_vocab: i32,
}

impl Drafter {
    /// Wraps `inner`; drafted ids must be below `n_vocab`.
    pub fn new(name: &str, inner: Box<dyn DraftPolicy>, n_vocab: usize) -> Drafter {
        Drafter { health: Health::new("draft plugin", name), inner, n_vocab: n_vocab as i32 }
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.health.name
    }

    /// Why the policy was disabled, if it was.
    pub fn disabled(&self) -> Option<&str> {
        self.health.disabled.as_deref()
    }

    /// The disable message, once, for the front end to show.
    pub fn take_notice(&mut self) -> Option<String> {
        self.health.notice.take()
    }

    /// Starts over with the whole context.
    pub fn reset(&mut self, context: &[i32]) {
        if self.health.ok()
            && let Err(e) = self.inner.reset(context)
        {
            self.health.disable(e);
        }
    }

    /// Reports accepted tokens.
    pub fn observe(&mut self, accepted: &[i32]) {
        if self.health.ok()
            && let Err(e) = self.inner.observe(accepted)
        {
            self.health.disable(e);
        }
    }

    /// Up to `max` valid draft tokens; empty when disabled or on a fault.
    pub fn draft(&mut self, max: u32) -> Vec<i32> {
        if !self.health.ok() || max == 0 {
            return Vec::new();
        }
        let fault = match self.inner.draft(max) {
            Err(e) => e,
            Ok(d) if d.len() > max as usize => format!("returned {} tokens, more than the {max} asked for", d.len()),
            Ok(d) => match d.iter().find(|&&t| t < 0 || t >= self.n_vocab) {
                Some(t) => format!("returned token id {t}, outside the vocabulary (0..{})", self.n_vocab),
                None => return d,
            },
        };
        self.health.disable(fault);
        Vec::new()
    }
}

/// A guarded drop policy.
pub struct Dropper {
    health: Health,
    inner: Box<dyn DropPolicy>,
    n_expert: u32,
}

impl Dropper {
    /// Wraps `inner`; expert ids must be below `n_expert`.
    pub fn new(name: &str, inner: Box<dyn DropPolicy>, n_expert: u32) -> Dropper {
        Dropper { health: Health::new("drop plugin", name), inner, n_expert }
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.health.name
    }

    /// Why the policy was disabled, if it was.
    pub fn disabled(&self) -> Option<&str> {
        self.health.disabled.as_deref()
    }

    /// The disable message, once.
    pub fn take_notice(&mut self) -> Option<String> {
        self.health.notice.take()
    }

    /// Which slots of `call` to drop (`true` = drop), or None to keep all
    /// (disabled, a fault, or nothing dropped).
    pub fn decide(&mut self, call: &DropCall<'_>) -> Option<Vec<bool>> {
        if !self.health.ok() {
            return None;
        }
        let fault = match self.inner.decide(call) {
            Ok(ids) if ids.is_empty() => return None,
            Ok(ids) => match validate_drops(&ids, call, self.n_expert) {
                Ok(mask) => return Some(mask),
                Err(fault) => fault,
            },
            Err(e) => e,
        };
        self.health.disable(fault);
        None
    }
}

/// Turns a list of dropped expert ids into a slot mask, or explains why it is invalid.
fn validate_drops(ids: &[u32], call: &DropCall<'_>, n_expert: u32) -> Result<Vec<bool>, String> {
    let mut seen = HashSet::new();
    let mut mask = vec![false; call.experts.len()];
    for &e in ids {
        if e >= n_expert {
            return Err(format!("dropped expert {e}, out of range (layer {} has {n_expert} experts)", call.layer));
        }
        if !seen.insert(e) {
            return Err(format!("listed expert {e} twice"));
        }
        let mut routed = false;
        for (slot, &x) in call.experts.iter().enumerate() {
            if x == e {
                mask[slot] = true;
                routed = true;
            }
        }
        if !routed {
            return Err(format!("dropped expert {e}, which layer {} did not route for this token", call.layer));
        }
    }
    if mask.iter().all(|&d| d) {
        return Err(format!("dropped every routed expert of layer {}", call.layer));
    }
    Ok(mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Vec<u32>);
    impl DropPolicy for Fixed {
        fn decide(&mut self, _: &DropCall<'_>) -> Result<Vec<u32>, String> {
            Ok(self.0.clone())
        }
    }

    fn call<'a>(experts: &'a [u32], weights: &'a [f32], resident: &'a [bool]) -> DropCall<'a> {
        DropCall { layer: 2, experts, weights, resident, k: experts.len() as u32 }
    }

    #[test]
    fn drop_answers_are_validated() {
        let (e, w, r) = ([5, 1, 7], [0.5, 0.3, 0.2], [false; 3]);
        let c = call(&e, &w, &r);
        let mut ok = Dropper::new("t", Box::new(Fixed(vec![7])), 8);
        assert_eq!(ok.decide(&c), Some(vec![false, false, true]));
        assert!(ok.disabled().is_none());
        for (ids, expect) in [
            (vec![3], "did not route"),
            (vec![100], "out of range"),
            (vec![1, 1], "twice"),
            (vec![5, 1, 7], "every routed expert"),
        ] {
            let mut d = Dropper::new("bad", Box::new(Fixed(ids)), 8);
            assert_eq!(d.decide(&c), None);
            let msg = d.take_notice().unwrap();
            assert!(msg.contains("`bad` disabled") && msg.contains(expect), "{msg}");
            // Disabled for good: later calls keep everything without asking.
            assert_eq!(d.decide(&c), None);
            assert!(d.take_notice().is_none());
        }
    }

    struct Echo(Vec<i32>);
    impl DraftPolicy for Echo {
        fn reset(&mut self, _: &[i32]) -> Result<(), String> {
            Ok(())
        }
        fn observe(&mut self, _: &[i32]) -> Result<(), String> {
            Ok(())
        }
        fn draft(&mut self, _: u32) -> Result<Vec<i32>, String> {
            Ok(self.0.clone())
        }
    }

    #[test]
    fn draft_answers_are_validated() {
        assert_eq!(Drafter::new("t", Box::new(Echo(vec![1, 2])), 10).draft(3), vec![1, 2]);
        for (d, expect) in
            [(vec![1, 2, 3, 4], "more than the 3"), (vec![10], "outside the vocabulary"), (vec![-1], "-1")]
        {
            let mut dr = Drafter::new("bad", Box::new(Echo(d)), 10);
            assert!(dr.draft(3).is_empty());
            assert!(dr.disabled().unwrap().contains(expect), "{:?}", dr.disabled());
        }
    }
}
