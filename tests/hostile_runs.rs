//! Hostile files during and between runs: a model truncated under a session
//! whose dense weights are in bmoe's own memory, and a model edited in place
//! behind its repacked copy's back (its size and modification time kept).

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bmoe::engine::{DenseWeights, EngineError, GenerateRequest, Repack, Session, SessionOptions, StreamOptions};
use bmoe::gguf::{GgmlType, ModelFiles};
use bmoe::llama::Sampling;
use bmoe::synth::Arch;
use common::*;

const N: u32 = 16;

fn request(n: u32) -> GenerateRequest {
    GenerateRequest {
        prompt: PROMPT.into(),
        n_predict: n,
        sampling: Sampling::default(),
        continue_context: false,
        keep_logits: true,
        constraint: None,
    }
}

/// `--dense-weights anon` holds every dense tensor the graph reads in
/// bmoe's memory, whatever its name (`blk.N.ssm_a` and `blk.N.ssm_d` of the
/// hybrids have no `.weight` or `.bias`), in every architecture the
/// generator makes. A model file cut before its first tensor while the
/// session is open then ends the next generation with a stream error naming
/// the file (a tensor left in llama.cpp's mapping would kill the process
/// with SIGBUS instead), and once the file is whole again the same session
/// gives the reference output.
#[test]
fn anon_dense_weights_outlive_a_truncated_model() {
    let dir = tempdir();
    for arch in Arch::ALL.iter().copied() {
        let name = format!("{arch:?}.gguf");
        let m = write_tiny(dir.path(), &name, arch, |_| {});
        let files = ModelFiles::open(&m).unwrap();
        if arch == Arch::Qwen3Next {
            let bare = files.tensors().filter(|t| !t.info.name.ends_with(".weight") && !t.info.name.ends_with(".bias"));
            assert!(bare.count() > 0, "the qwen3next model should have tensors named without .weight or .bias");
        }
        let cut = files.tensors().map(|t| t.file_offset).min().unwrap();
        let anon = stream0(2, false).map(|s| StreamOptions { dense: DenseWeights::Anon, ..s });
        let (reference, _) = run(options(&m, None), N);
        let original = std::fs::read(&m).unwrap();
        let _serial = llama_lock();
        let mut session = Session::open(options(&m, anon)).unwrap();
        std::fs::OpenOptions::new().write(true).open(&m).unwrap().set_len(cut).unwrap();
        let err = session.generate(&request(N), &mut |_| {}).unwrap_err();
        assert!(matches!(err, EngineError::Stream(_)), "{arch:?}: {err}");
        assert!(err.to_string().contains(&name), "{arch:?}: the error names the file: {err}");
        let f = std::fs::OpenOptions::new().write(true).open(&m).unwrap();
        f.write_all_at(&original[cut as usize..], cut).unwrap();
        let g = session.generate(&request(N), &mut |_| {}).unwrap();
        assert_identical(&reference, &g, &format!("{arch:?}, anon, after the file was whole again"));
    }
}

/// A model edited in place (the middle expert of every bank overwritten
/// with the first, the size kept and the modification time set back) gets
/// its repacked copy written again at the next open, and the run from the
/// new copy equals the resident run of the edited model.
#[test]
fn a_model_edited_in_place_gets_a_new_repacked_copy() {
    if bmoe::llama::Repacker::new(GgmlType::Q4_0.id(), 64, 64).is_none() {
        eprintln!("this CPU has no repacked q4_0 kernel: no repacked copy to keep fresh");
        return;
    }
    let dir = tempdir();
    let copies = tempdir();
    let m = write_tiny(dir.path(), "q4.gguf", Arch::Qwen3Moe, |s| s.expert_type = GgmlType::Q4_0);
    let on = |stream| SessionOptions { repack: Repack::On, ..options(&m, stream) };
    let from_copy = stream0(2, true).map(|s| StreamOptions { repacked_copy: Some(copies.path().into()), ..s });
    let wrote = |notices: &[String]| notices.iter().any(|n| n.contains("wrote a repacked copy"));
    let notices = open_notices(on(from_copy.clone()));
    assert!(wrote(&notices), "the first open writes the copy: {notices:?}");
    let (before, _) = run(on(from_copy.clone()), N);
    let written = copies_in(copies.path());
    assert_eq!(written.len(), 1, "{written:?}");

    let meta = std::fs::metadata(&m).unwrap();
    let (len, mtime) = (meta.len(), meta.modified().unwrap());
    let files = ModelFiles::open(&m).unwrap();
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&m).unwrap();
    let mut edited_banks = 0;
    for bank in files.tensors().filter(|t| t.info.name.ends_with("_exps.weight")) {
        let n = bank.info.dims[2];
        assert!(n >= 4, "{}: {n} experts", bank.info.name);
        let slice = bank.info.size / n;
        let mut first = vec![0u8; slice as usize];
        f.read_exact_at(&mut first, bank.file_offset).unwrap();
        let middle = bank.file_offset + n / 2 * slice;
        let mut old = vec![0u8; slice as usize];
        f.read_exact_at(&mut old, middle).unwrap();
        assert_ne!(old, first, "{}: experts 0 and {} already equal", bank.info.name, n / 2);
        f.write_all_at(&first, middle).unwrap();
        edited_banks += 1;
    }
    assert!(edited_banks >= 3);
    f.sync_all().unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    let meta = std::fs::metadata(&m).unwrap();
    assert_eq!((meta.len(), meta.modified().unwrap()), (len, mtime), "the edit keeps the size and modification time");

    let (edited, _) = run(on(None), N);
    assert!(first_difference(&before, &edited).is_some(), "the edited expert is never routed: the test shows nothing");
    let notices = open_notices(on(from_copy.clone()));
    assert!(wrote(&notices), "the copy of the model before the edit was reused: {notices:?}");
    let now = copies_in(copies.path());
    assert_eq!(now.len(), 1, "the stale copy is removed: {now:?}");
    assert_ne!(now, written, "the new copy has a new home");
    let (streamed, reports) = run(on(from_copy.clone()), N);
    assert_identical(&edited, &streamed, "from the copy written after the edit");
    assert_eq!(reports.iter().map(|r| r.trace.bounced_slices).sum::<u64>(), 0, "read in place from the copy");
    let notices = open_notices(on(from_copy));
    assert!(!wrote(&notices), "the new copy is reused: {notices:?}");
}

/// One damaged slice of the repacked copy, in a bank and at an expert the
/// fixed part of the open's check never reads (not the first bank of its
/// shape, not the first or last expert), is found by the slices drawn at
/// random at each open: within a few opens the copy is refused (one open
/// in about 12 finds it; 400 all missing it has a chance under 1e-13), and
/// the next open writes it again.
#[test]
fn damage_anywhere_in_a_repacked_copy_is_found_within_a_few_opens() {
    if bmoe::llama::Repacker::new(GgmlType::Q4_0.id(), 64, 64).is_none() {
        eprintln!("this CPU has no repacked q4_0 kernel: no repacked copy to check");
        return;
    }
    let dir = tempdir();
    let copies = tempdir();
    let m = write_tiny(dir.path(), "q4.gguf", Arch::Qwen3Moe, |s| s.expert_type = GgmlType::Q4_0);
    let on = |stream| SessionOptions { repack: Repack::On, ..options(&m, stream) };
    let from_copy = stream0(2, true).map(|s| StreamOptions { repacked_copy: Some(copies.path().into()), ..s });
    let notices = open_notices(on(from_copy.clone()));
    assert!(notices.iter().any(|n| n.contains("wrote a repacked copy")), "{notices:?}");
    let copy = copies_in(copies.path()).remove(0);
    let files = ModelFiles::open(&m).unwrap();
    let bank = files.tensors().find(|t| t.info.name == "blk.2.ffn_down_exps.weight").unwrap();
    let n = bank.info.dims[2];
    let at = bank.file_offset + n / 2 * (bank.info.size / n) + 5;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&copy).unwrap();
    let mut byte = [0u8];
    f.read_exact_at(&mut byte, at).unwrap();
    f.write_all_at(&[byte[0] ^ 0x5a], at).unwrap();
    drop(f);
    let found = (1..=400)
        .find(|_| open_notices(on(from_copy.clone())).iter().any(|n| n.contains("differs from a fresh repack")));
    let opens = found.expect("400 opens never drew the damaged slice");
    eprintln!("found after {opens} opens");
    let notices = open_notices(on(from_copy));
    assert!(notices.iter().any(|n| n.contains("wrote a repacked copy")), "{notices:?}");
}

/// The notices of an open with `opts`.
fn open_notices(opts: SessionOptions) -> Vec<String> {
    let _serial = llama_lock();
    Session::open(opts).unwrap().info().notices.clone()
}

/// The copies' shard files under `dir`.
fn copies_in(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.extend(copies_in(&p));
        } else if p.extension().is_some_and(|e| e == "gguf") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// A model whose header is cut and restored over and over while bmoe reads
/// it: each open either reads it whole or says what was cut, and the
/// process lives (the header was mapped before, and a page cut away under
/// the map killed it with SIGBUS). The header (a 24 MB token list) needs
/// several reads, so most opens overlap a cut.
#[test]
fn a_header_cut_while_it_is_read_gives_an_error_not_a_signal() {
    use bmoe::gguf::{GgufFile, GgufWriter, TensorSpec, Value, ValueType};
    let dir = tempdir();
    let path = dir.path().join("long-header.gguf");
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    let tokens = (0..400_000).map(|i| Value::String(format!("token-{i:08}-{}", "x".repeat(40)))).collect();
    w.set("tokenizer.ggml.tokens", Value::Array(ValueType::String, tokens));
    w.add_tensor(TensorSpec::new("t.weight", &[32], GgmlType::F32));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    w.write(&mut out, &mut |_| Ok(vec![0; 128])).unwrap();
    drop(out);
    let whole = std::fs::read(&path).unwrap();
    assert!(whole.len() > 20 << 20, "{} bytes", whole.len());
    let parsed = GgufFile::open(&path).unwrap();
    assert_eq!(parsed.file_size, whole.len() as u64);

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cutter = {
        let (path, stop, whole) = (path.clone(), stop.clone(), whole.clone());
        std::thread::spawn(move || {
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            let mut cuts = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                f.set_len(whole.len() as u64 / 3).unwrap();
                f.write_all_at(&whole[whole.len() / 3..], whole.len() as u64 / 3).unwrap();
                cuts += 1;
            }
            cuts
        })
    };
    let (mut whole_reads, mut refused) = (0, 0);
    for _ in 0..40 {
        match GgufFile::open(&path) {
            Ok(f) => {
                assert_eq!(f.tensors().len(), 1);
                whole_reads += 1;
            }
            Err(e) => {
                let text = e.to_string();
                assert!(text.contains("long-header.gguf") && text.lines().count() == 1, "{text}");
                refused += 1;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let cuts = cutter.join().unwrap();
    eprintln!("{cuts} cuts; {whole_reads} opens read the header whole, {refused} were refused");
    assert!(cuts > 0 && whole_reads + refused == 40, "{cuts} cuts, {whole_reads} whole, {refused} refused");
}
