//! Byte-identity gates: every lossless streaming configuration must produce
//! the same tokens and bitwise the same logits, at every step, as the plain
//! memory-mapped (resident) run of the same model.

mod common;

use bmoe::engine::{CacheBudget, DenseWeights, Phase, SessionOptions, StreamOptions};
use bmoe::gguf::GgmlType;
use bmoe::moe::evict::CachePolicy;
use bmoe::moe::predict::ReadAhead;
use bmoe::synth::Arch;
use common::*;

const N: u32 = 32;

fn gate(model: &std::path::Path, stream: Option<StreamOptions>, what: &str) -> Vec<bmoe::engine::StepReport> {
    let (reference, _) = run(options(model, None), N);
    let (streamed, reports) = run(options(model, stream), N);
    assert_identical(&reference, &streamed, what);
    let read: u64 = reports.iter().map(|r| r.trace.bytes_read).sum();
    assert!(read > 0, "{what}: no expert bytes were read, so nothing was streamed");
    reports
}

#[test]
fn cache_off_one_lane() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let reports = gate(&m, stream0(1, true), "cache off, 1 lane");
    // Cache off re-reads every routed expert every token.
    for r in reports.iter().filter(|r| r.phase == Phase::Decode) {
        assert_eq!(r.trace.hits, 0);
        assert_eq!(r.trace.bytes_read, r.trace.lookups * 3 * 64 * 64 * 4, "step {}", r.step);
    }
}

#[test]
fn two_compute_threads() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let two = |stream| SessionOptions { threads: 2, ..options(&m, stream) };
    let (reference, _) = run(two(None), N);
    for stream in [stream0(2, true), cached(100 * 1024, 2)] {
        let (streamed, _) = run(two(stream.clone()), N);
        assert_identical(&reference, &streamed, &format!("two compute threads, {stream:?}"));
    }
}

#[test]
fn dense_weights_warm_anon_and_auto() {
    let dir = tempdir();
    for arch in [Arch::Qwen3Moe, Arch::Gemma4, Arch::GptOss] {
        let m = write_tiny(dir.path(), &format!("{arch:?}.gguf"), arch, |_| {});
        for dense in [DenseWeights::Warm, DenseWeights::Anon, DenseWeights::Auto] {
            // The mode really handled the dense weights (every non-expert weight the graph reads).
            {
                let _serial = llama_lock();
                let s =
                    bmoe::engine::Session::open(options(&m, stream0(1, true).map(|s| StreamOptions { dense, ..s })))
                        .unwrap();
                let note = s.info().details.iter().find(|n| n.starts_with("dense weights")).cloned();
                let note = note.unwrap_or_else(|| panic!("{arch:?} {}: no dense-weights notice", dense.name()));
                let tensors: usize = note.split(": ").nth(1).and_then(|t| t.split(' ').next()?.parse().ok()).unwrap();
                assert!(tensors > 4, "{note}");
                // A tiny model's dense weights are far below auto's 64 MiB: held in bmoe's memory.
                let mode = if dense == DenseWeights::Auto { "anon (auto)" } else { dense.name() };
                assert!(note.starts_with(&format!("dense weights {mode}: ")), "{note}");
            }
            for stream in [stream0(2, true), cached(100 * 1024, 2)] {
                let stream = stream.map(|s| StreamOptions { dense, ..s });
                gate(&m, stream.clone(), &format!("{arch:?}, dense weights {}, {stream:?}", dense.name()));
            }
        }
    }
}

#[test]
fn cache_off_four_lanes() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    gate(&m, stream0(4, true), "cache off, 4 lanes");
}

#[test]
fn cache_evicting_every_token() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    // One entry is 48 KiB; a token routes 8 entries; 100 KiB holds about two.
    for lanes in [1, 4] {
        let reports = gate(&m, cached(100 * 1024, lanes), "cache 100 KiB");
        for r in reports.iter().filter(|r| r.phase == Phase::Decode) {
            assert!(r.trace.evictions > 0, "step {} evicted nothing", r.step);
        }
    }
}

#[test]
fn both_cache_policies_are_lossless() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    // Between one token's working set and the bank: the policies evict differently.
    for policy in CachePolicy::ALL {
        let stream = cached(600 << 10, 2).map(|s| StreamOptions { cache_policy: policy, ..s });
        let reports = gate(&m, stream, &format!("cache 600 KiB, {}", policy.name()));
        assert!(reports.iter().any(|r| r.trace.evictions > 0) && reports.iter().any(|r| r.trace.hits > 0));
    }
}

#[test]
fn recycled_pages_are_lossless() {
    // An evicted entry's whole pages move under the next entries read
    // (mremap), on loads and on read-ahead. Q8_0 slices of 4.25 pages give
    // windows of 3 and 4 whole pages at different leads, so moves need runs
    // of matching size; F32 slices are exactly 4 pages.
    let dir = tempdir();
    let q8 = write_tiny(dir.path(), "q8.gguf", Arch::Qwen3Moe, |s| {
        s.expert_type = GgmlType::Q8_0;
        s.expert_ff = 256;
    });
    let f32 = write_tiny(dir.path(), "f32.gguf", Arch::Qwen3Moe, |_| {});
    let ahead = ReadAhead { layers: 1, router: 1, prefill: true };
    // Under qemu-user page moves are off (its mremap leaves the source
    // unmapped for the guest); the runs must still be lossless.
    let moves = bmoe::llama::memory::page_moves_work();
    if !moves {
        eprintln!("page moves do not work here: checking losslessness with pages released");
    }
    for (m, budget) in [(&q8, 400 << 10), (&f32, 300 << 10)] {
        for read_ahead in [ReadAhead::default(), ahead] {
            let what = format!("{}, cache {budget} bytes, {read_ahead:?}", m.display());
            let stream = cached(budget, 3).map(|s| StreamOptions { read_ahead, ..s });
            let reports = gate(m, stream, &what);
            let recycled: u64 = reports.iter().map(|r| r.trace.recycled_bytes).sum();
            let evictions: u64 = reports.iter().map(|r| r.trace.evictions).sum();
            assert!(
                evictions > 0 && (recycled > 0) == moves,
                "{what}: {evictions} evictions, {recycled} bytes recycled"
            );
            if read_ahead.router > 0 {
                assert!(reports.iter().any(|r| r.trace.prefetched > 0), "{what}: nothing was read ahead");
            }
        }
    }
    // Turned off, evictions release their pages and nothing moves.
    let stream = cached(400 << 10, 3).map(|s| StreamOptions { recycle_pages: false, ..s });
    let reports = gate(&q8, stream, "pages not recycled");
    assert!(reports.iter().all(|r| r.trace.recycled_bytes == 0));
    assert!(reports.iter().any(|r| r.trace.evictions > 0));
}

#[test]
fn io_uring_reads_are_lossless() {
    // Reads through io_uring into the cache's registered arena. Q8_0 slices
    // of 4.25 pages read their partial edge pages as plain reads and their
    // whole pages into the arena; F32 slices are exactly 4 pages. Small
    // budgets evict every token (arena runs move between entries); a budget
    // holding the whole bank spans several of the arena's 2 MiB chunks, so
    // runs cross chunk boundaries. One lane reads on the compute thread;
    // four batch their reads into shared submissions, with read-ahead too.
    let dir = tempdir();
    let q8 = write_tiny(dir.path(), "q8.gguf", Arch::Qwen3Moe, |s| {
        s.expert_type = GgmlType::Q8_0;
        s.expert_ff = 256;
        s.experts = 64;
    });
    let f32 = write_tiny(dir.path(), "f32.gguf", Arch::Qwen3Moe, |_| {});
    let bank = {
        let _serial = llama_lock();
        let s = bmoe::engine::Session::open(options(&q8, cached(400 << 10, 4))).unwrap();
        let info = s.info();
        let refused = info.details.iter().find(|d| d.contains("not io_uring"));
        if !info.io_uring && refused.is_some_and(|d| d.contains("not permitted") || d.contains("not implemented")) {
            eprintln!("io_uring is refused here, so its gate cannot run: {refused:?}");
            return;
        }
        assert!(info.io_uring, "io_uring was not used: {:?}", info.details);
        info.bank_bytes
    };
    assert!(bank > 5 << 20, "the whole bank spans several arena chunks ({bank} bytes)");
    let ahead = ReadAhead { layers: 1, router: 2, prefill: true };
    for (m, budget) in [(&q8, 400 << 10), (&f32, 300 << 10), (&q8, bank)] {
        for (lanes, read_ahead) in [(1, ReadAhead::default()), (4, ReadAhead::default()), (4, ahead)] {
            let what = format!("io_uring, {}, cache {budget} bytes, {lanes} lanes, {read_ahead:?}", m.display());
            let stream = cached(budget, lanes).map(|s| StreamOptions { read_ahead, ..s });
            let reports = gate(m, stream, &what);
            let fixed: u64 = reports.iter().map(|r| r.trace.fixed_slices).sum();
            assert!(fixed > 0, "{what}: no slice was read through io_uring");
            if budget < bank {
                assert!(reports.iter().map(|r| r.trace.evictions).sum::<u64>() > 0, "{what}: nothing evicted");
            }
        }
    }
    // Turned off, every read is a positioned read.
    let reports = gate(&q8, cached(400 << 10, 4).map(|s| StreamOptions { io_uring: false, ..s }), "io_uring off");
    assert_eq!(reports.iter().map(|r| r.trace.fixed_slices).sum::<u64>(), 0);
}

#[test]
fn cache_holding_everything_hits() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let reports = gate(&m, cached(64 << 20, 2), "cache larger than the bank");
    let hits: u64 = reports.iter().map(|r| r.trace.hits).sum();
    assert!(hits > 0);
    assert!(reports.iter().all(|r| r.trace.evictions == 0));
}

#[test]
fn buffered_reads() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    gate(&m, stream0(2, false), "O_DIRECT off");
    gate(&m, cached(100 * 1024, 2).map(|s| StreamOptions { o_direct: false, ..s }), "O_DIRECT off, cache");
}

#[test]
fn o_direct_is_really_used() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    {
        let _serial = llama_lock();
        let s = bmoe::engine::Session::open(options(&m, stream0(2, true))).unwrap();
        let info = s.info();
        assert!(info.o_direct, "O_DIRECT was not available under {}: {:?}", env!("CARGO_TARGET_TMPDIR"), info.notices);
    }
    // Unaligned slices read whole 4 KiB windows, straight into place (no
    // bounce copy): slots, cache, and the cache with read-ahead.
    let ahead = cached(100 * 1024, 2)
        .map(|s| StreamOptions { read_ahead: ReadAhead { layers: 1, router: 1, prefill: true }, ..s });
    for (stream, what) in [
        (stream0(2, true), "O_DIRECT on"),
        (cached(100 * 1024, 2), "O_DIRECT on, cache"),
        (ahead, "O_DIRECT on, read-ahead"),
    ] {
        let reports = gate(&m, stream, what);
        assert!(reports.iter().any(|r| r.trace.window_bytes > r.trace.bytes_read), "{what}");
        let bounced: u64 = reports.iter().map(|r| r.trace.bounced_slices).sum();
        assert_eq!(bounced, 0, "{what}: slices went through a bounce buffer");
    }
}

#[test]
fn three_turn_session() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let turns = [PROMPT, " and then", " finally, the end."];
    let (reference, _) = run_turns(options(&m, None), &turns, 16);
    for stream in [stream0(2, true), cached(100 * 1024, 2), cached(64 << 20, 2)] {
        let (streamed, _) = run_turns(options(&m, stream.clone()), &turns, 16);
        for (i, (a, b)) in reference.iter().zip(&streamed).enumerate() {
            assert_identical(a, b, &format!("turn {i} with {stream:?}"));
        }
    }
}

/// A prompt that takes several ubatches of [`in_small_ubatches`].
const LONG_PROMPT: &str =
    "A longer prompt, long enough to need several micro-batches of seven tokens each, and two batches.";

/// Options that split a prompt into batches of 40 tokens and ubatches of 7.
fn in_small_ubatches(model: &std::path::Path, stream: Option<StreamOptions>) -> SessionOptions {
    SessionOptions { batch: 40, ubatch: 7, ..options(model, stream) }
}

#[test]
fn prompt_prefilled_in_several_ubatches() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (reference, _) = run_turns(in_small_ubatches(&m, None), &[LONG_PROMPT], 24);
    for stream in [stream0(1, true), cached(100 * 1024, 4)] {
        let (streamed, reports) = run_turns(in_small_ubatches(&m, stream), &[LONG_PROMPT], 24);
        assert_identical(&reference[0], &streamed[0], "ubatch 7, batch 40");
        let prefills = reports.iter().filter(|r| r.phase == Phase::Prefill).count();
        assert!(prefills >= 2, "prompt should take several batches, took {prefills}");
    }
}

/// Prompt chunks read the next layer's predicted experts while a layer
/// computes: output stays the resident run's, what is read ahead is used,
/// and the cache never grows past its budget to make room for it.
#[test]
fn prompt_read_ahead_is_lossless_and_within_budget() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (reference, _) = run_turns(in_small_ubatches(&m, None), &[LONG_PROMPT], 8);
    // 400 KiB holds a whole layer (8 entries of 48 KiB), so every load fits, but not two
    // layers' worth of a 7-token ubatch: the read-ahead must stop at the room left.
    for (budget, prefill) in [(400 << 10, true), (400 << 10, false), (64 << 20, true)] {
        let what = format!("cache {budget} bytes, prompt read-ahead {prefill}");
        let read_ahead = ReadAhead { layers: 0, router: 1, prefill };
        let stream = cached(budget, 3).map(|s| StreamOptions { read_ahead, ..s });
        let (streamed, reports) = run_turns(in_small_ubatches(&m, stream), &[LONG_PROMPT], 8);
        assert_identical(&reference[0], &streamed[0], &what);
        let prompt_reports: Vec<_> = reports.iter().filter(|r| r.phase == Phase::Prefill).collect();
        let ahead: u64 = prompt_reports.iter().map(|r| r.trace.prefetched).sum();
        let used: u64 = prompt_reports.iter().map(|r| r.trace.prefetch_used).sum();
        let scored = prompt_reports.iter().map(|r| r.trace.predictions.len()).sum::<usize>();
        if prefill {
            assert!(ahead > 0 && used > 0, "{what}: {used} of {ahead} entries read ahead were used");
            assert!(scored > 0, "{what}: no prompt layer was predicted");
        } else {
            assert_eq!((ahead, scored), (0, 0), "{what}");
        }
        for r in &reports {
            assert!(r.trace.cache_peak <= budget, "{what}: {} bytes held over {budget}", r.trace.cache_peak);
        }
    }
}

#[test]
fn three_shard_split_model() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "split.gguf", Arch::Qwen3Moe, |s| s.split = 3);
    assert!(m.to_string_lossy().ends_with("split-00001-of-00003.gguf"));
    let files = bmoe::gguf::ModelFiles::open(&m).unwrap();
    assert_eq!(files.paths().len(), 3);
    let shards: std::collections::BTreeSet<usize> =
        files.tensors().filter(|t| t.info.name.contains("_exps")).map(|t| t.shard).collect();
    assert!(shards.len() >= 2, "experts should span shards: {shards:?}");
    gate(&m, stream0(2, true), "3-shard split, cache off");
    gate(&m, cached(100 * 1024, 2), "3-shard split, cache");
}

#[test]
fn quantized_experts() {
    let dir = tempdir();
    for (ty, name) in [(GgmlType::Q8_0, "q8.gguf"), (GgmlType::Q4_0, "q4.gguf"), (GgmlType::F16, "f16.gguf")] {
        let m = write_tiny(dir.path(), name, Arch::Qwen3Moe, |s| s.expert_type = ty);
        gate(&m, stream0(2, true), &format!("{ty} experts, cache off"));
        gate(&m, cached(20 * 1024, 2), &format!("{ty} experts, cache"));
    }
}

#[test]
fn fused_gate_up_layout() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "gemma.gguf", Arch::Gemma4, |_| {});
    let files = bmoe::gguf::ModelFiles::open(&m).unwrap();
    assert!(files.locate("blk.1.ffn_gate_up_exps.weight").is_some());
    assert!(files.locate("blk.0.ffn_gate_up_exps.weight").is_none(), "layer 0 is dense");
    let reports = gate(&m, stream0(2, true), "gemma4 fused, cache off");
    // Layer 0 has no experts: no routing rows for it.
    assert!(reports.iter().all(|r| r.trace.rows.iter().all(|row| row.layer >= 1)));
    gate(&m, cached(100 * 1024, 2), "gemma4 fused, cache");
    gate(
        &m,
        Some(StreamOptions {
            cache: CacheBudget::Off,
            cache_policy: Default::default(),
            dense: DenseWeights::Mmap,
            io_threads: 1,
            o_direct: false,
            io_uring: true,
            read_ahead: ReadAhead::default(),
            lean: None,
            recycle_pages: true,
            repacked_copy: None,
            repacked_copy_max_bytes: None,
            route_profile: bmoe::engine::RouteProfileOpen::off(),
        }),
        "gemma4 buffered",
    );
}

#[test]
fn gpt_oss_with_expert_biases() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "oss.gguf", Arch::GptOss, |s| s.expert_type = GgmlType::Q8_0);
    let files = bmoe::gguf::ModelFiles::open(&m).unwrap();
    assert!(files.locate("blk.0.ffn_up_exps.bias").is_some(), "biases exist and stay resident");
    let reports = gate(&m, stream0(2, true), "gpt-oss, cache off");
    // Softmax over the selected experts: each token's weights sum to 1.
    let rows = &reports.iter().find(|r| r.phase == Phase::Decode).unwrap().trace.rows;
    assert!((rows[0].weight + rows[1].weight - 1.0).abs() < 1e-5, "{rows:?}");
    gate(&m, cached(20 * 1024, 2), "gpt-oss, cache");
}

#[test]
fn fewer_experts_is_reproducible_and_lossy() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |s| s.experts_used = 3);
    let k1 = |stream| SessionOptions { n_expert_used: Some(1), ..options(&m, stream) };
    let (resident_k1, _) = run(k1(None), N);
    let (streamed_k1, reports) = run(k1(stream0(2, true)), N);
    assert_identical(&resident_k1, &streamed_k1, "--n-expert-used 1");
    let decode = reports.iter().find(|r| r.phase == Phase::Decode).unwrap();
    assert!(decode.trace.rows.iter().all(|r| r.slot == 0), "one expert per token");
    let (full, _) = run(options(&m, None), N);
    assert!(first_difference(&full, &resident_k1).is_some(), "top-1 should change the logits");
}

/// Negative control: the gate must be able to fail. Poison one expert slice
/// that the run routes, in the file the streamer reads, and check that the
/// comparison catches it.
#[test]
fn poisoned_slice_is_detected() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (reference, reports) = run(options(&m, stream0(1, false)), N);
    let decode_row = reports.iter().find(|r| r.phase == Phase::Decode).unwrap().trace.rows[0];
    let files = bmoe::gguf::ModelFiles::open(&m).unwrap();
    let name = format!("blk.{}.ffn_down_exps.weight", decode_row.layer);
    let loc = files.locate(&name).unwrap();
    let slice = loc.info.size / 8;
    let at = loc.file_offset + u64::from(decode_row.expert) * slice;
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&m).unwrap();
        f.write_all_at(&[0x7f; 64], at + slice / 2).unwrap();
    }
    let (poisoned, _) = run(options(&m, stream0(1, false)), N);
    let diff = first_difference(&reference, &poisoned);
    assert!(
        diff.is_some(),
        "a poisoned slice of layer {} expert {} went unnoticed",
        decode_row.layer,
        decode_row.expert
    );
}

/// Read-ahead changes only what is read early, never the routing, and reads
/// only into the room the budget leaves: every mode on every architecture,
/// with a cache that evicts every token, one holding about a third of the
/// bank and one holding all of it.
#[test]
fn read_ahead_is_lossless() {
    let dir = tempdir();
    let modes = [
        ReadAhead { layers: 1, router: 0, prefill: true },
        ReadAhead { layers: 3, router: 0, prefill: true },
        ReadAhead { layers: 0, router: 1, prefill: true },
        ReadAhead { layers: 0, router: 2, prefill: true },
        ReadAhead { layers: 2, router: 3, prefill: true },
    ];
    for arch in [Arch::Qwen3Moe, Arch::Gemma4, Arch::GptOss] {
        let m = write_tiny(dir.path(), &format!("{arch:?}.gguf"), arch, |_| {});
        let (reference, _) = run(options(&m, None), N);
        let streamed_layers = {
            let _serial = llama_lock();
            bmoe::engine::Session::open(options(&m, stream0(1, true))).unwrap().info().streamed_layers as usize
        };
        for read_ahead in modes {
            for budget in [200 << 10, 600 << 10, 64 << 20] {
                let what = format!("{arch:?}, {read_ahead:?}, cache {budget} bytes");
                let stream = cached(budget, 3).map(|s| StreamOptions { read_ahead, ..s });
                let (streamed, reports) = run(options(&m, stream), N);
                assert_identical(&reference, &streamed, &what);
                let decode: Vec<_> = reports.iter().filter(|r| r.phase == Phase::Decode).collect();
                let prefetched: u64 = decode.iter().map(|r| r.trace.prefetched).sum();
                let used: u64 = decode.iter().map(|r| r.trace.prefetch_used).sum();
                assert!(used <= prefetched, "{what}: {used} of {prefetched} read-ahead entries used");
                if budget == 200 << 10 {
                    // Four entries fit: a load holds two, which leaves room for two read ahead,
                    // and whatever is read ahead was evicted since the last token.
                    assert!(prefetched > 0, "{what}: nothing was read ahead");
                }
                // (The prompt's own load may pass a budget this small; a decode step's fits.)
                let peak = decode.iter().map(|r| r.trace.cache_peak).max().unwrap_or(0);
                assert!(peak <= budget, "{what}: the cache held {peak} bytes");
                let scores: Vec<_> = decode.iter().flat_map(|r| &r.trace.predictions).collect();
                if read_ahead.router > 0 {
                    // Every streamed layer is predicted while the cache does not hold the whole
                    // bank (1.5 MiB): the first from the token's embedding, the others from the
                    // layer before. At 200 KiB that is every step; a larger cache may hold all
                    // that a stretch of steps routes, and the prediction then rests (after 64
                    // layers in a row found everything resident) for every layer alike.
                    if budget < 1 << 20 {
                        let mut per_layer = std::collections::BTreeMap::new();
                        scores.iter().for_each(|s| *per_layer.entry(s.layer).or_insert(0) += 1);
                        assert_eq!(per_layer.len(), streamed_layers, "{what}: layers predicted {per_layer:?}");
                        let (fewest, most) = (per_layer.values().min(), per_layer.values().max());
                        assert!(fewest.zip(most).is_some_and(|(f, m)| m - f <= 1), "{what}: {per_layer:?}");
                        if budget == 200 << 10 {
                            assert!(per_layer.values().all(|&n| n == decode.len()), "{what}: {per_layer:?}");
                        }
                    }
                    assert!(scores.iter().all(|s| s.right <= s.routed && s.routed >= 2), "{what}");
                } else {
                    assert!(scores.is_empty(), "{what}");
                }
            }
        }
    }
}

/// With the whole bank cached there is nothing to read ahead: the predictor
/// rests, and output is still the resident run's.
#[test]
fn router_prediction_rests_when_everything_is_cached() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (reference, _) = run(options(&m, None), N);
    let _serial = llama_lock();
    let stream = cached(64 << 20, 2)
        .map(|s| StreamOptions { read_ahead: ReadAhead { layers: 0, router: 1, prefill: true }, ..s });
    let mut session = bmoe::engine::Session::open(options(&m, stream)).unwrap();
    let store = session.store().unwrap();
    let all: Vec<i32> = (0..store.n_expert() as i32).collect();
    for il in 0..64 {
        if store.has_layer(il) {
            store.load_layer(il, &all).unwrap();
        }
    }
    assert_eq!(store.resident_bytes(), store.bank_bytes());
    let (streamed, reports) = generate_steps(&mut session, N);
    assert_identical(&reference, &streamed, "everything cached, router read-ahead on");
    assert!(
        reports.iter().all(|r| r.trace.predictions.is_empty() && r.trace.prefetched == 0 && r.trace.bytes_read == 0)
    );
}

/// A cache holding everything decode routes, though not the whole bank:
/// once 64 layers in a row found their experts and guesses resident, the
/// router prediction rests (it would only cost time), and output is still
/// the resident run's.
#[test]
fn router_prediction_rests_while_everything_routed_is_cached() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (reference, _) = run(options(&m, None), N);
    let stream = cached(64 << 20, 2)
        .map(|s| StreamOptions { read_ahead: ReadAhead { layers: 0, router: 2, prefill: true }, ..s });
    // An expert this prompt never routes stays out of the cache.
    let (_, probe) = run(options(&m, stream.clone()), N);
    let routed: std::collections::BTreeSet<(u32, u32)> =
        probe.iter().flat_map(|r| &r.trace.rows).map(|row| (row.layer, row.expert)).collect();
    let _serial = llama_lock();
    let mut session = bmoe::engine::Session::open(options(&m, stream)).unwrap();
    let store = session.store().unwrap();
    let n = store.n_expert() as u32;
    let layers: Vec<u32> = (0..64).filter(|&il| store.has_layer(il as usize)).collect();
    let unused = layers.iter().flat_map(|&il| (0..n).map(move |e| (il, e))).find(|p| !routed.contains(p));
    let unused = unused.expect("the prompt routes every expert of every layer");
    for &il in &layers {
        let ids: Vec<i32> = (0..n).filter(|&e| (il, e) != unused).map(|e| e as i32).collect();
        store.load_layer(il as usize, &ids).unwrap();
    }
    assert!(!store.holds_whole_bank());
    let (streamed, reports) = generate_steps(&mut session, N);
    assert_identical(&reference, &streamed, "everything routed cached, router read-ahead on");
    let decode: Vec<_> = reports.iter().filter(|r| r.phase == Phase::Decode).collect();
    assert!(decode.iter().all(|r| r.trace.bytes_read == 0));
    assert!(!decode[0].trace.predictions.is_empty(), "the prediction runs at first");
    assert!(decode.last().unwrap().trace.predictions.is_empty(), "and rests once nothing is left to read");
}

/// Run on a layer's own input, the predictor must pick what the router
/// picked: this checks the hidden state it reads, the folded norm weight,
/// the bias and the top-k.
#[test]
fn router_predictor_reproduces_the_routing_of_its_own_layer() {
    let dir = tempdir();
    for arch in [Arch::Qwen3Moe, Arch::Gemma4, Arch::GptOss] {
        let m = write_tiny(dir.path(), &format!("{arch:?}.gguf"), arch, |_| {});
        let _serial = llama_lock();
        // Less than the bank: with everything cached the predictor rests.
        let stream = cached(600 << 10, 2)
            .map(|s| StreamOptions { read_ahead: ReadAhead { layers: 0, router: 1, prefill: true }, ..s });
        let mut session = bmoe::engine::Session::open(options(&m, stream)).unwrap();
        session.hook_mut().unwrap().predict_own_layer();
        let layers = session.info().streamed_layers;
        let (_, reports) = generate_steps(&mut session, N);
        let scores = reports.iter().flat_map(|r| &r.trace.predictions);
        let (routed, right) = scores.fold((0, 0), |(a, b), s| (a + s.routed, b + s.right));
        // Every streamed layer of every decode step, two experts or more each.
        assert!(routed >= layers * 2 * (N - 1), "{arch:?}: {routed} routed experts scored");
        // ggml's own dot product, but the norm is applied after it rather than
        // before, so a near tie may flip.
        assert!(right * 100 >= routed * 98, "{arch:?}: predicted {right} of {routed}");
    }
}

/// The tuner lets the compute threads poll between graph splits while
/// steps read nothing on quiet cores; polling is scheduling only. Checked
/// with polling forced on every step: resident, and streamed with
/// read-ahead and a cache that fills as it goes (steps that read and steps
/// that do not), against resident with sleeping threads.
#[test]
fn polling_threads_do_not_change_results() {
    let dir = tempdir();
    for arch in [Arch::Qwen3Moe, Arch::Gemma4, Arch::GptOss] {
        let m = write_tiny(dir.path(), &format!("{arch:?}.gguf"), arch, |_| {});
        let (sleeping, _) = run(SessionOptions { threads: 2, ..options(&m, None) }, N);
        let _serial = llama_lock();
        let read_ahead = ReadAhead { layers: 1, router: 1, prefill: true };
        for stream in [None, cached(600 << 10, 2).map(|s| StreamOptions { read_ahead, ..s })] {
            let streamed = stream.is_some();
            let mut session =
                bmoe::engine::Session::open(SessionOptions { threads: 2, ..options(&m, stream) }).unwrap();
            session.force_polling(true);
            let (polled, reports) = generate_steps(&mut session, N);
            assert_identical(&sleeping, &polled, &format!("{arch:?}: polling threads, streamed: {streamed}"));
            if streamed {
                assert!(reports.iter().any(|r| r.trace.bytes_read > 0), "{arch:?}: some steps read");
            }
        }
    }
}

/// The step tuner changes the compute thread count (and turns read-ahead on
/// and off) between decode steps, which is lossless only because results
/// do not depend on either: checked resident (one thread against two) and
/// streamed with the tuner and read-ahead on (told the cores are contended,
/// it starts at two threads and tries one at the 4th step).
#[test]
fn thread_count_does_not_change_results() {
    const STEPS: u32 = 48;
    let dir = tempdir();
    for arch in [Arch::Qwen3Moe, Arch::Gemma4, Arch::GptOss] {
        let m = write_tiny(dir.path(), &format!("{arch:?}.gguf"), arch, |_| {});
        let (one, _) = run(options(&m, None), STEPS);
        let (two, _) = run(SessionOptions { threads: 2, ..options(&m, None) }, STEPS);
        assert_identical(&one, &two, &format!("{arch:?}: one thread against two"));
        let read_ahead = ReadAhead { layers: 1, router: 1, prefill: true };
        let stream = cached(600 << 10, 2).map(|s| StreamOptions { read_ahead, ..s });
        let tuned = SessionOptions { threads: 2, tune: true, ..options(&m, stream) };
        let (streamed, reports) = {
            let _serial = llama_lock();
            let mut session = bmoe::engine::Session::open(tuned).unwrap();
            session.tune_as_if_contended();
            generate_steps(&mut session, STEPS)
        };
        assert_identical(&one, &streamed, &format!("{arch:?}: streamed, threads tuned"));
        let used: std::collections::BTreeSet<u32> = reports.iter().map(|r| r.threads).collect();
        assert_eq!(used.into_iter().collect::<Vec<_>>(), [1, 2], "{arch:?}");
    }
}

/// Without a route trace the host stops reading the routing weights, which
/// removes one graph split per layer: still the resident run's output.
#[test]
fn routing_weights_not_recorded() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (reference, _) = run(options(&m, None), N);
    for stream in [stream0(2, true), cached(600 << 10, 2)] {
        let _serial = llama_lock();
        let mut session = bmoe::engine::Session::open(options(&m, stream.clone())).unwrap();
        session.set_record_weights(false);
        let (streamed, reports) = generate_steps(&mut session, N);
        assert!(reports.iter().flat_map(|r| &r.trace.rows).all(|row| row.weight.is_nan()));
        let rows: usize = reports.iter().map(|r| r.trace.rows.len()).sum();
        assert!(rows > 0);
        assert_identical(&reference, &streamed, &format!("weights not recorded, {stream:?}"));
    }
}

/// A lean open loads a copy of the model whose expert bytes are holes: the
/// output is the resident run's on every architecture, cache on and off; the
/// copy is written once, is sparse and is reused; a model that changed gets
/// a new copy and its old one goes; small models can be left to load whole.
#[test]
fn lean_open_is_lossless_and_reused() {
    use bmoe::engine::{LeanOpen, Session};
    use std::os::unix::fs::MetadataExt;
    let dir = tempdir();
    let lean_dir = dir.path().join("lean");
    let lean = |min_expert_bytes| {
        Some(LeanOpen { dir: lean_dir.clone(), min_expert_bytes, only_when_larger_than_memory: false })
    };
    let open_notices = |m: &std::path::Path, lean| {
        let _serial = llama_lock();
        let s = Session::open(options(m, stream0(2, true).map(|s| StreamOptions { lean, ..s }))).unwrap();
        s.info().notices.clone()
    };
    for arch in [Arch::Qwen3Moe, Arch::Gemma4, Arch::GptOss] {
        let m = write_tiny(dir.path(), &format!("{arch:?}.gguf"), arch, |_| {});
        assert!(open_notices(&m, lean(0)).iter().any(|n| n.starts_with("wrote a lean copy")));
        assert!(!open_notices(&m, lean(0)).iter().any(|n| n.contains("lean")), "the copy was not reused");
        for stream in [stream0(2, true), cached(600 << 10, 2)] {
            gate(&m, stream.map(|s| StreamOptions { lean: lean(0), ..s }), &format!("{arch:?}, lean open"));
        }
    }
    let copies: Vec<_> = std::fs::read_dir(&lean_dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(copies.len(), 3, "{copies:?}");
    for arch in [Arch::Qwen3Moe, Arch::Gemma4, Arch::GptOss] {
        let m = dir.path().join(format!("{arch:?}.gguf"));
        let files = bmoe::gguf::ModelFiles::open(&m).unwrap();
        let experts: u64 = files
            .tensors()
            .filter(|t| bmoe::moe::recipe::parse_expert_tensor(&t.info.name).is_some())
            .map(|t| t.info.size)
            .sum();
        let copy = copies.iter().find(|c| c.file_name().unwrap().to_string_lossy().starts_with(&format!("{arch:?}-")));
        let meta = std::fs::metadata(copy.unwrap().join(format!("{arch:?}.gguf"))).unwrap();
        // Holes, not blocks: what is allocated is the dense bytes (plus a block at each hole's edges).
        let allocated = meta.blocks() * 512;
        assert!(experts > meta.len() / 3, "{arch:?}: {experts} expert bytes");
        assert!(
            allocated < meta.len() - experts + 64 * 4096,
            "{arch:?}: {allocated} of {} bytes allocated",
            meta.len()
        );
    }

    // The model changes (another seed): a new copy replaces the old one, and output follows the new model.
    let m = write_tiny(dir.path(), "Qwen3Moe.gguf", Arch::Qwen3Moe, |s| s.seed = 7);
    assert!(open_notices(&m, lean(0)).iter().any(|n| n.starts_with("wrote a lean copy")));
    assert_eq!(std::fs::read_dir(&lean_dir).unwrap().count(), 3);
    gate(&m, stream0(2, true).map(|s| StreamOptions { lean: lean(0), ..s }), "lean open after the model changed");

    // Below the size threshold, or fitting in memory when that is asked, the model loads whole.
    let small = write_tiny(dir.path(), "small.gguf", Arch::Qwen3Moe, |_| {});
    assert!(!open_notices(&small, lean(u64::MAX)).iter().any(|n| n.contains("lean")));
    let fits = Some(LeanOpen { dir: lean_dir.clone(), min_expert_bytes: 0, only_when_larger_than_memory: true });
    assert!(!open_notices(&small, fits).iter().any(|n| n.contains("lean")));
    assert_eq!(std::fs::read_dir(&lean_dir).unwrap().count(), 3);
}

/// Expert banks repacked for the CPU's interleaved kernels: llama.cpp
/// repacks the resident banks as it loads them, bmoe each streamed slice
/// as it reads it, and the two agree bit for bit; with repacking off on
/// both sides they agree too. The repacked kernels really run: their
/// logits differ from the file layout's.
#[test]
fn repacked_experts_stream_like_resident_ones() {
    use bmoe::engine::Repack;
    let dir = tempdir();
    let m = write_tiny(dir.path(), "q4.gguf", Arch::Qwen3Moe, |s| s.expert_type = GgmlType::Q4_0);
    if bmoe::llama::Repacker::new(GgmlType::Q4_0.id(), 64, 64).is_none() {
        eprintln!("this CPU has no repacked q4_0 kernel: the repacking gate has nothing to compare");
        return;
    }
    let with = |repack, stream| SessionOptions { repack, ..options(&m, stream) };
    let banks = |opts| {
        let _serial = llama_lock();
        bmoe::engine::Session::open(opts).unwrap().info().repacked_banks
    };
    // Three projections in each of the tiny model's layers.
    let layers =
        bmoe::gguf::ModelFiles::open(&m).unwrap().tensors().filter(|t| t.info.name.ends_with("_exps.weight")).count();
    assert!(layers >= 3);
    assert_eq!(banks(with(Repack::Auto, None)), layers as u32, "resident banks repacked at load");
    assert_eq!(banks(with(Repack::On, stream0(2, true))), layers as u32, "streamed banks repacked as read");
    assert_eq!(banks(with(Repack::Off, None)), 0);
    assert_eq!(banks(with(Repack::Off, stream0(2, true))), 0);
    let (repacked, _) = run(with(Repack::On, None), N);
    let (plain, _) = run(with(Repack::Off, None), N);
    assert!(first_difference(&repacked, &plain).is_some(), "repacked kernels gave the file layout's exact logits");
    let copies = tempdir();
    let from_copy =
        |s: Option<StreamOptions>| s.map(|s| StreamOptions { repacked_copy: Some(copies.path().into()), ..s });
    for (repack, reference) in [(Repack::On, &repacked), (Repack::Off, &plain)] {
        for (how, stream) in [
            ("cache off", stream0(2, true)),
            ("evicting cache", cached(20 * 1024, 2)),
            ("cache off, repacked copy", from_copy(stream0(2, true))),
            ("evicting cache, repacked copy", from_copy(cached(20 * 1024, 2))),
        ] {
            let what = format!("repack {}, {how}", repack.name());
            if repack == Repack::On && how.contains("copy") {
                // A copy that could not be written says why at the open.
                let notices = copy_notices(with(repack, stream.clone()));
                assert!(notices.iter().all(|n| !n.contains("no repacked copy")), "{what}: {notices:?}");
            }
            let (streamed, reports) = run(with(repack, stream), N);
            assert_identical(reference, &streamed, &what);
            assert!(reports.iter().map(|r| r.trace.bytes_read).sum::<u64>() > 0, "{what}: nothing read");
            // Repacked as read: through the bounce buffer; from the copy: in place.
            let bounced: u64 = reports.iter().map(|r| r.trace.bounced_slices).sum();
            let in_flight = repack == Repack::On && !how.contains("copy");
            assert_eq!(bounced > 0, in_flight, "{what}: {bounced} slices bounced");
        }
    }
    // The copy was written once (one shard), with the file's size, and is
    // reused; a damaged one (here in a slice the open's sample covers: the
    // first bank of each shape, first and last expert) is refused, removed
    // and written again.
    let written: Vec<_> =
        walk(copies.path()).into_iter().filter(|p| p.extension().is_some_and(|e| e == "gguf")).collect();
    assert_eq!(written.len(), 1, "{written:?}");
    assert_eq!(std::fs::metadata(&written[0]).unwrap().len(), std::fs::metadata(&m).unwrap().len());
    let files = bmoe::gguf::ModelFiles::open(&m).unwrap();
    let bank = files.tensors().find(|t| t.info.name == "blk.0.ffn_gate_exps.weight").unwrap();
    let mut bytes = std::fs::read(&written[0]).unwrap();
    bytes[bank.file_offset as usize] ^= 0xff;
    std::fs::write(&written[0], &bytes).unwrap();
    let _serial = llama_lock();
    let s = bmoe::engine::Session::open(with(Repack::On, from_copy(stream0(2, true)))).unwrap();
    assert!(s.info().notices.iter().any(|n| n.contains("differs from a fresh repack")), "{:?}", s.info().notices);
    drop(s);
    let s = bmoe::engine::Session::open(with(Repack::On, from_copy(stream0(2, true)))).unwrap();
    assert!(s.info().notices.iter().any(|n| n.contains("wrote a repacked copy")), "{:?}", s.info().notices);
}

/// The notices of an open with `opts` (a repacked copy that could not be
/// written says why among them).
fn copy_notices(opts: SessionOptions) -> Vec<String> {
    let _serial = llama_lock();
    bmoe::engine::Session::open(opts).unwrap().info().notices.clone()
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

/// A repacked copy over its disk budget is partial: each expert repacked as
/// it is read is also written into it while the budget lasts, and a later
/// run reads those from the copy as stored (in place where the copy holds
/// the neighbours too). Both runs equal the resident run bitwise.
#[test]
fn partial_repacked_copy_fills_as_experts_are_read() {
    use bmoe::engine::Repack;
    let dir = tempdir();
    let m = write_tiny(dir.path(), "q4.gguf", Arch::Qwen3Moe, |s| s.expert_type = GgmlType::Q4_0);
    if bmoe::llama::Repacker::new(GgmlType::Q4_0.id(), 64, 64).is_none() {
        eprintln!("this CPU has no repacked q4_0 kernel: nothing to copy");
        return;
    }
    let copies = tempdir();
    let with = |stream: Option<StreamOptions>| SessionOptions {
        repack: Repack::On,
        ..options(
            &m,
            stream.map(|s| StreamOptions {
                repacked_copy: Some(copies.path().into()),
                repacked_copy_max_bytes: Some(64 << 10),
                ..s
            }),
        )
    };
    let (reference, _) = run(SessionOptions { repack: Repack::On, ..options(&m, None) }, N);
    let bounced = |reports: &[bmoe::engine::StepReport]| reports.iter().map(|r| r.trace.bounced_slices).sum::<u64>();
    let notices = copy_notices(with(stream0(2, true)));
    assert!(notices.iter().any(|n| n.contains("over its disk budget")), "{notices:?}");
    let (first, first_reports) = run(with(cached(20 * 1024, 2)), N);
    assert_identical(&reference, &first, "partial copy, first run");
    let present = walk(copies.path()).into_iter().find(|p| p.file_name().is_some_and(|n| n == "present"));
    let bits: u32 =
        std::fs::read(present.expect("a bitmap beside the copy")).unwrap().iter().map(|b| b.count_ones()).sum();
    // 2304-byte slices under a 64 KiB budget: the copy holds 28 of them.
    assert_eq!(bits, (64 << 10) / 2304, "slices held");
    for (how, stream) in [("cache off", stream0(2, true)), ("evicting cache", cached(20 * 1024, 2))] {
        let (again, reports) = run(with(stream), N);
        assert_identical(&reference, &again, &format!("partial copy, {how}"));
        let read: u64 = reports.iter().map(|r| r.trace.bytes_read / 2304).sum();
        assert!(bounced(&reports) < read, "{how}: every slice was repacked as read ({read} slices)");
    }
    assert!(bounced(&first_reports) > 0);
    // `--repack auto` streams repacked only from a whole copy: not from this
    // partial one, but once the budget would hold the whole copy.
    let files = bmoe::gguf::ModelFiles::open(&m).unwrap();
    assert!(!bmoe::moe::repacked::whole_copy_expected(&files, copies.path(), Some(64 << 10)));
    assert!(bmoe::moe::repacked::whole_copy_expected(&files, copies.path(), None));
}

/// A split model streams from a repacked copy of each shard.
#[test]
fn split_model_streams_from_repacked_copies() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "split.gguf", Arch::Qwen3Moe, |s| {
        s.split = 3;
        s.expert_type = GgmlType::Q4_0;
    });
    if bmoe::llama::Repacker::new(GgmlType::Q4_0.id(), 64, 64).is_none() {
        eprintln!("this CPU has no repacked q4_0 kernel: nothing to copy");
        return;
    }
    let copies = tempdir();
    let on = |stream| SessionOptions { repack: bmoe::engine::Repack::On, ..options(&m, stream) };
    let from_copy = stream0(2, true).map(|s| StreamOptions { repacked_copy: Some(copies.path().into()), ..s });
    let (reference, _) = run(on(None), N);
    let notices = copy_notices(on(from_copy.clone()));
    assert!(notices.iter().all(|n| !n.contains("no repacked copy")), "{notices:?}");
    let (streamed, reports) = run(on(from_copy), N);
    assert_identical(&reference, &streamed, "3-shard split, repacked copy");
    assert_eq!(reports.iter().map(|r| r.trace.bounced_slices).sum::<u64>(), 0, "read in place from the copies");
    let shards = walk(copies.path()).into_iter().filter(|p| p.extension().is_some_and(|e| e == "gguf")).count();
    assert_eq!(shards, 3);
}
