//! The offline cache replay against the live cache: on a trace bmoe
//! recorded without read-ahead, replaying the live policy (LRU or decay)
//! with the run's budget gives the live hits row for row (prefill in
//! several ubatches, several turns, with and without a drop policy); and on
//! the shared real-model traces Belady's optimum is never beaten.

mod common;

use std::path::Path;

use bmoe::config::{CacheMb, RunConfig};
use bmoe::host::{Host, HostEvent};
use bmoe::replay::{Learned, Policy, ReplayOptions, Trace, replay, replay_with};
use bmoe::synth::Arch;
use common::*;

/// Runs three chat turns with a route trace and returns (trace text,
/// decode lookups and hits the live cache counted).
fn live_run(dir: &Path, edit: impl FnOnce(&mut RunConfig)) -> (String, u64, u64) {
    let template = bmoe::chat::named_template("qwen3").map(str::to_string);
    let model = write_tiny(dir, "tiny.gguf", Arch::Qwen3Moe, |s| s.chat_template = template);
    let trace = dir.join("route.csv");
    let mut c = RunConfig::default();
    c.generate.threads = 1;
    c.generate.n_predict = 24;
    c.moe.stream = bmoe::config::StreamMode::On;
    c.moe.cache_mb = CacheMb::Mib(0.5);
    // The replay models the cache alone; router read-ahead fills it too.
    c.moe.predict = false;
    // Cold, as the replay starts: no route profile's warm start or prior.
    c.moe.route_profile = "off".into();
    c.moe.cache_policy = "lru".into();
    c.telemetry.route_trace = trace.clone();
    edit(&mut c);
    let mut host = Host::open(c, &model).unwrap();
    for message in ["How are experts chosen?", "Tell me more about the cache", "Thanks"] {
        host.chat(message, &mut |_: HostEvent<'_>| {}).unwrap();
    }
    let (lookups, hits) = (host.totals().lookups, host.totals().hits);
    host.finish().unwrap();
    (std::fs::read_to_string(trace).unwrap(), lookups, hits)
}

fn assert_replay_matches(policy: Policy, text: &str, lookups: u64, hits: u64) {
    let trace = Trace::parse(text).unwrap();
    let r = replay(&trace, (0.5 * 1048576.0) as u64, policy);
    let recorded: Vec<bool> = trace.loads.iter().flat_map(|l| l.recorded_hits.iter().copied()).collect();
    assert_eq!(r.row_hits.len(), recorded.len());
    if let Some(i) = r.row_hits.iter().zip(&recorded).position(|(a, b)| a != b) {
        panic!("row {i}: replay says hit={}, the live cache said {}", r.row_hits[i], recorded[i]);
    }
    assert_eq!((r.decode_lookups, r.decode_hits), (lookups, hits), "decode lookups and hits");
    assert!(r.evictions > 0 && r.decode_hits > 0 && r.decode_hits < r.decode_lookups, "{r:?}");
}

#[test]
fn lru_replay_equals_the_live_cache_row_for_row() {
    let dir = tempdir();
    let _serial = llama_lock();
    // Prefill in ubatches of 5 tokens: several loads per layer per call.
    let (text, lookups, hits) = live_run(dir.path(), |c| c.generate.ubatch = 5);
    assert_replay_matches(Policy::Lru, &text, lookups, hits);
}

#[test]
fn decay_replay_equals_the_live_cache_row_for_row() {
    let dir = tempdir();
    let _serial = llama_lock();
    let (text, lookups, hits) = live_run(dir.path(), |c| {
        c.generate.ubatch = 5;
        c.moe.cache_policy = "decay".into();
    });
    assert_replay_matches(Policy::Decay, &text, lookups, hits);
    // The two policies differ on this run: the check above is not LRU's again.
    let lru = replay(&Trace::parse(&text).unwrap(), (0.5 * 1048576.0) as u64, Policy::Lru);
    let recorded: Vec<bool> = Trace::parse(&text).unwrap().loads.iter().flat_map(|l| l.recorded_hits.clone()).collect();
    assert_ne!(lru.row_hits, recorded, "LRU gives the same hits: the run does not tell the policies apart");
}

#[test]
fn decay_replay_equals_the_live_cache_with_a_drop_policy() {
    let dir = tempdir();
    let _serial = llama_lock();
    let (text, lookups, hits) = live_run(dir.path(), |c| {
        c.moe.cache_policy = "decay".into();
        c.plugins.drop_plugin = "drop-cold".into();
        c.plugins.drop_params = vec!["F=1".into()];
    });
    assert!(text.lines().any(|l| l.ends_with(",1") && !l.starts_with('#')), "nothing was dropped");
    assert_replay_matches(Policy::Decay, &text, lookups, hits);
}

#[test]
fn belady_bounds_the_other_policies_on_the_shared_traces() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/route-traces");
    let mut seen = 0;
    for f in std::fs::read_dir(&dir).unwrap() {
        let path = f.unwrap().path();
        if path.extension().is_none_or(|e| e != "csv") {
            continue;
        }
        let trace = Trace::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let bank = trace.bank_bytes();
        for frac in [0.1, 0.25, 0.5] {
            let budget = (frac * bank as f64) as u64;
            let best = replay(&trace, budget, Policy::Belady).decode_hit_rate();
            for p in Policy::ALL.into_iter().filter(|&p| p != Policy::Belady) {
                let rate = replay(&trace, budget, p).decode_hit_rate();
                assert!(
                    rate <= best + 1e-12,
                    "{}: {} at {frac} beat belady: {rate} > {best}",
                    path.display(),
                    p.name()
                );
            }
        }
        seen += 1;
    }
    assert_eq!(seen, 3);
}

/// A one-layer trace of single-expert decode steps, one expert per step.
fn single_expert_trace(experts: &[u32]) -> String {
    let mut text = String::from(
        "# route_trace v1\n# model=t.gguf arch=qwen3moe n_layer=1 n_expert=16 n_expert_used=1\n\
         # layer=0 expert_bytes=100 dense_bytes=0\nturn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped\n",
    );
    for (step, e) in experts.iter().enumerate() {
        text.push_str(&format!("0,1,{step},0,0,{e},1.0,0,100,0\n"));
    }
    text
}

#[test]
fn popular_keeps_the_most_used_expert_that_lru_loses() {
    // Expert 0 comes back after every two one-off experts: with room for
    // two, LRU has always just evicted it; knowing its popularity keeps it.
    let rounds = 5u32;
    let mut order = Vec::new();
    for r in 0..rounds {
        order.extend([0, 1 + 2 * r, 2 + 2 * r]);
    }
    let trace = Trace::parse(&single_expert_trace(&order)).unwrap();
    let lru = replay(&trace, 200, Policy::Lru);
    let popular = replay(&trace, 200, Policy::Popular);
    assert_eq!((lru.decode_lookups, lru.decode_hits), (15, 0));
    assert_eq!((popular.decode_lookups, popular.decode_hits), (15, u64::from(rounds) - 1));
    assert!(popular.decode_hits <= replay(&trace, 200, Policy::Belady).decode_hits);
}

#[test]
fn foresight_spares_the_expert_the_next_load_uses() {
    // Three experts in a cycle with room for two: LRU and decay always
    // evict the one the next step wants; seeing one load ahead spares it.
    let order: Vec<u32> = (0..12).map(|i| i % 3).collect();
    let trace = Trace::parse(&single_expert_trace(&order)).unwrap();
    let lru = replay(&trace, 200, Policy::Lru);
    let decay = replay(&trace, 200, Policy::Decay);
    let foresight = replay(&trace, 200, Policy::Foresight(1));
    assert_eq!((lru.decode_hits, decay.decode_hits), (0, 0));
    // From the fourth step on, every other step hits.
    assert_eq!(foresight.decode_hits, 5);
    // One routed layer: one token's worth is one load.
    assert_eq!(replay(&trace, 200, Policy::Foresight(0)).row_hits, foresight.row_hits);
    assert!(foresight.decode_hits <= replay(&trace, 200, Policy::Belady).decode_hits);
}

#[test]
fn policy_names_parse_back() {
    for p in Policy::ALL.into_iter().chain([Policy::Foresight(3)]) {
        assert_eq!(p.name().parse::<Policy>(), Ok(p));
    }
    assert_eq!("foresight:3".parse::<Policy>(), Ok(Policy::Foresight(3)));
    for bad in ["foresight:0", "foresight:x", "foresight:", "fifo"] {
        assert!(bad.parse::<Policy>().is_err(), "{bad}");
    }
}

/// The shared real-model traces (one prompt and its decode each).
fn shared_traces() -> Vec<(String, Trace)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/route-traces");
    let mut traces: Vec<(String, Trace)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|f| f.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "csv"))
        .map(|p| (p.display().to_string(), Trace::parse(&std::fs::read_to_string(&p).unwrap()).unwrap()))
        .collect();
    traces.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(traces.len(), 3);
    traces
}

#[test]
fn without_a_profile_the_default_is_decay_row_for_row() {
    for (name, trace) in shared_traces() {
        let budget = (0.1 * trace.bank_bytes() as f64) as u64;
        let (default, decay) = (replay(&trace, budget, Policy::Default), replay(&trace, budget, Policy::Decay));
        assert_eq!(default.row_hits, decay.row_hits, "{name}");
        assert_eq!(default.decode_bytes, decay.decode_bytes, "{name}");
    }
}

/// A profile learned from each trace's prompt describes another workload
/// than its decode (the prompt's popular experts are not the reply's): the
/// prior alone reads more than decay on every trace, and the duel keeps the
/// default within 2% of decay. Warm starts read within the budget, counted
/// apart from the tokens' reads.
#[test]
fn a_profile_from_another_workload_costs_the_default_next_to_nothing() {
    for (name, trace) in shared_traces() {
        let learned = Learned::from_prompt(&trace);
        for frac in [0.1, 0.19] {
            let budget = (frac * trace.bank_bytes() as f64) as u64;
            let opts = ReplayOptions { learned: Some(&learned), warm: true, decode_only: true };
            let bytes = |p: Policy| replay_with(&trace, budget, p, opts).decode_bytes as f64;
            let (default, decay, prior) = (bytes(Policy::Default), bytes(Policy::Decay), bytes(Policy::PriorDecay));
            assert!(prior > decay * 1.03, "{name} at {frac}: the prompt's prior read {prior} against decay's {decay}");
            assert!(default <= decay * 1.02, "{name} at {frac}: default read {default} against decay's {decay}");
            let r = replay_with(&trace, budget, Policy::Default, opts);
            assert!(r.warm_bytes > 0 && r.warm_bytes <= budget, "{name}: warm start {}", r.warm_bytes);
            assert_eq!(r.prefill_bytes, 0, "{name}: decode alone");
        }
    }
}
