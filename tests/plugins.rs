//! The plugin host: bundled plugins against their native twins (property
//! tests), and hostile plugins contained with a named fault.

mod common;

use bmoe::policy::wasm::{Limits, Source, WasmDrafter, WasmDropper, fixture};
use bmoe::policy::{DraftPolicy, Drafter, DropCall, DropPolicy, Dropper, native};
use common::hostile_limits;
use proptest::prelude::*;

fn drafter(name: &str, params: &[(&str, &str)]) -> WasmDrafter {
    let params: Vec<(String, String)> = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    WasmDrafter::load(&Source::parse(name), &params, Limits::default()).unwrap_or_else(|e| panic!("{e}"))
}

fn hostile_drafter(mode: &str) -> Drafter {
    let p = vec![("mode".to_string(), mode.to_string())];
    let w = WasmDrafter::load(&Source::File(fixture("hostile-drafter")), &p, hostile_limits(mode)).unwrap();
    Drafter::new("hostile-drafter", Box::new(w), 1000)
}

fn hostile_dropper(mode: &str) -> Dropper {
    let p = vec![("mode".to_string(), mode.to_string())];
    let w = WasmDropper::load(&Source::File(fixture("hostile-dropper")), &p, hostile_limits(mode)).unwrap();
    Dropper::new("hostile-dropper", Box::new(w), 8)
}

/// Feeds the same history to both and compares every draft.
fn same_drafts(
    a: &mut dyn DraftPolicy,
    b: &mut dyn DraftPolicy,
    tokens: &[i32],
    split: usize,
    chunks: &[(usize, u32)],
) {
    let split = split.min(tokens.len());
    a.reset(&tokens[..split]).unwrap();
    b.reset(&tokens[..split]).unwrap();
    let mut at = split;
    for &(len, max) in chunks {
        let wa = a.draft(max).unwrap();
        let wb = b.draft(max).unwrap();
        assert_eq!(wa, wb, "after {at} tokens, max {max}");
        let end = (at + len).min(tokens.len());
        a.observe(&tokens[at..end]).unwrap();
        b.observe(&tokens[at..end]).unwrap();
        at = end;
    }
}

/// Token streams with many repeats: a small alphabet and copied blocks.
fn stream() -> impl Strategy<Value = Vec<i32>> {
    prop::collection::vec(prop_oneof![3 => 0..5i32, 1 => 0..40i32], 0..160).prop_flat_map(|base| {
        let n = base.len();
        (Just(base), 0..=n, 0..=n).prop_map(|(mut b, from, len)| {
            // Append a copy of an earlier block so long matches exist.
            let end = (from + len / 2).min(b.len());
            let block: Vec<i32> = b[from.min(end)..end].to_vec();
            b.extend(block);
            b
        })
    })
}

fn chunks() -> impl Strategy<Value = Vec<(usize, u32)>> {
    prop::collection::vec((1usize..6, 0u32..9), 1..40)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn ngram_plugin_equals_native(tokens in stream(), split in 0usize..200, ch in chunks(), min in 1usize..4, extra in 0usize..6) {
        let max = min + extra;
        let mut wasm = drafter("ngram", &[("min_match", &min.to_string()), ("max_match", &max.to_string())]);
        let mut twin = native::Twin::new(native::Ngram { min_match: min, max_match: max });
        same_drafts(&mut wasm, &mut twin, &tokens, split, &ch);
    }

    #[test]
    fn ngram_multi_plugin_equals_native(tokens in stream(), split in 0usize..200, ch in chunks(), n_min in 1usize..3, extra in 0usize..3, min_count in 1u32..3) {
        let n_max = n_min + extra;
        let mut wasm = drafter("ngram-multi", &[
            ("n_min", &n_min.to_string()), ("n_max", &n_max.to_string()), ("min_count", &min_count.to_string()),
        ]);
        let mut twin = native::Twin::new(native::NgramMulti { n_min, n_max, min_count });
        same_drafts(&mut wasm, &mut twin, &tokens, split, &ch);
    }

    #[test]
    fn suffix_plugin_equals_native(tokens in stream(), split in 0usize..200, ch in chunks(), depth in 3usize..12, p in 0.0f64..0.9, alpha in 0.5f64..4.0) {
        let p = (p * 100.0).round() / 100.0;
        let alpha = (alpha * 10.0).round() / 10.0;
        let mut wasm = drafter("suffix", &[
            ("max_depth", &depth.to_string()), ("min_match", "1"), ("p_min", &p.to_string()), ("alpha", &alpha.to_string()),
        ]);
        let mut twin = native::Twin::new(native::Suffix { max_depth: depth, min_match: 1, p_min: p, alpha });
        same_drafts(&mut wasm, &mut twin, &tokens, split, &ch);
    }

    #[test]
    fn drop_cold_plugin_equals_native(
        routes in prop::collection::vec((prop::collection::vec((0u32..16, 0.0f32..1.0, any::<bool>()), 1..9), 0u32..48), 1..40),
        f in 0.0f32..=1.0,
    ) {
        let params = vec![("F".to_string(), f.to_string())];
        let mut wasm = WasmDropper::load(&Source::parse("drop-cold"), &params, Limits::default()).unwrap();
        let mut twin = native::DropCold { f: f.to_string().parse().unwrap() };
        for (slots, layer) in routes {
            let experts: Vec<u32> = slots.iter().map(|s| s.0).collect();
            let weights: Vec<f32> = slots.iter().map(|s| s.1).collect();
            let resident: Vec<bool> = slots.iter().map(|s| s.2).collect();
            let call = DropCall { layer, experts: &experts, weights: &weights, resident: &resident, k: experts.len() as u32 };
            prop_assert_eq!(wasm.decide(&call).unwrap(), twin.decide(&call).unwrap());
        }
    }
}

#[test]
fn bundled_defaults_match_the_twins() {
    for name in ["ngram", "ngram-multi", "suffix"] {
        let mut wasm = drafter(name, &[]);
        let mut twin = native::drafter(name).unwrap();
        let tokens: Vec<i32> = (0..600).map(|i| [1, 2, 3, 4, 5, 1, 2, 3, 9, 7][i % 10] + (i / 97) as i32).collect();
        same_drafts(&mut wasm, twin.as_mut(), &tokens, 50, &[(7, 8); 60]);
        assert_eq!(wasm.info().name, name);
        assert_eq!(wasm.info().interface, "0.1.0");
    }
}

#[test]
fn hostile_drafters_are_disabled_with_a_named_fault() {
    for (mode, expect) in [
        ("loop", "ran past its 20 ms CPU-time limit"),
        ("grow", "exceeded its memory limit of 16 MiB"),
        ("trap", "trapped"),
        ("huge", "more than the 4 asked for"),
        ("oov", "token id 1000000, outside the vocabulary (0..1000)"),
        ("negative", "token id -5"),
    ] {
        let mut d = hostile_drafter(mode);
        d.reset(&[1, 2, 3]);
        assert!(d.draft(4).is_empty(), "{mode}");
        let msg = d.take_notice().unwrap_or_else(|| panic!("{mode}: no notice"));
        assert!(msg.contains("draft plugin `hostile-drafter` disabled") && msg.contains(expect), "{mode}: {msg}");
        // Later calls do nothing and say nothing more.
        assert!(d.draft(4).is_empty());
        assert!(d.take_notice().is_none());
    }
    // A fault in reset disables too.
    let mut d = hostile_drafter("loop-reset");
    d.reset(&[1]);
    assert!(d.disabled().unwrap().contains("ran past"));
}

#[test]
fn hostile_droppers_are_disabled_with_a_named_fault() {
    let experts = [3u32, 5];
    let call = DropCall { layer: 1, experts: &experts, weights: &[0.7, 0.3], resident: &[false, false], k: 2 };
    for (mode, expect) in [
        ("unrouted", "dropped expert 0, which layer 1 did not route"),
        ("out-of-range", "dropped expert 100000, out of range (layer 1 has 8 experts)"),
        ("all", "dropped every routed expert"),
        ("duplicate", "listed expert 5 twice"),
        ("trap", "trapped"),
        ("loop", "ran past its 20 ms CPU-time limit"),
        ("grow", "exceeded its memory limit"),
    ] {
        let mut d = hostile_dropper(mode);
        assert_eq!(d.decide(&call), None, "{mode}");
        let msg = d.take_notice().unwrap_or_else(|| panic!("{mode}: no notice"));
        assert!(msg.contains("drop plugin `hostile-dropper` disabled") && msg.contains(expect), "{mode}: {msg}");
    }
    let mut keep = hostile_dropper("keep");
    assert_eq!(keep.decide(&call), None);
    assert!(keep.disabled().is_none());
}

#[test]
fn bad_files_are_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.wasm");
    std::fs::write(&text, "this is not wasm").unwrap();
    let load = |s: Source| WasmDrafter::load(&s, &[], Limits::default()).err().unwrap();
    assert!(load(Source::File(text)).contains("not a WebAssembly file"));
    assert!(load(Source::File(dir.path().join("missing.wasm"))).contains("cannot read plugin"));
    let e = load(Source::File(fixture("future-drafter")));
    assert!(e.contains("built for bmoe:policy@1.0.0") && e.contains("0.1.x"), "{e}");
    let e = load(Source::Bundled("drop-cold"));
    assert!(e.contains("is a dropper plugin"), "{e}");
    let e =
        WasmDrafter::load(&Source::parse("ngram"), &[("bogus".into(), "1".into())], Limits::default()).err().unwrap();
    assert!(e.contains("rejected its parameters") && e.contains("bogus"), "{e}");
    // The error lists what the plugin takes (drop-cold's one parameter is F).
    let e =
        WasmDropper::load(&Source::parse("drop-cold"), &[("T".into(), "0.6".into())], Limits::default()).err().unwrap();
    assert!(e.contains("`T`") && e.contains("it takes F (default 0.75)"), "{e}");
    let e = WasmDrafter::load(&Source::parse("ngram"), &[("min_match".into(), "x".into())], Limits::default())
        .err()
        .unwrap();
    assert!(e.contains("min_match"), "{e}");
}
