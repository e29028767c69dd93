//! This machine's speeds as `bmoe fit` measures them: how many weights a
//! decode step multiplies per second (real llama.cpp on a small synthetic
//! model in the model's own tensor types), and how fast the disk serves
//! expert-sized reads (the bench harness's probe).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::engine::{GenerateRequest, Session, SessionOptions};
use crate::gguf::GgmlType;
use crate::llama::Sampling;
use crate::synth::{Arch, ModelSpec, Preset, write_model};

/// Tokens decoded to warm the probe model up; then `TIMED_RUNS` runs of
/// `TIMED_TOKENS` are timed, and their spread (this machine's noise) is
/// carried into the estimate's range.
const WARM_TOKENS: u32 = 4;
const TIMED_TOKENS: u32 = 16;
const TIMED_RUNS: usize = 3;

/// Seconds each disk probe reads for.
const DISK_PROBE: Duration = Duration::from_millis(1500);

/// The probe model: two layers of the bench preset's shape (Qwen3-30B-A3B's
/// widths), every expert routed, experts in `expert_type` and the dense
/// matrices in `dense_type` (where the generator writes them; else Q4_K and
/// F16). About 75 M expert and 38 M dense weights per token: more than a
/// CPU's caches hold, as a real model's are.
fn probe_spec(expert_type: GgmlType, dense_type: GgmlType) -> ModelSpec {
    let base = ModelSpec { layers: 2, experts: 8, experts_used: 8, ..ModelSpec::preset(Preset::Bench, Arch::Qwen3Moe) };
    let chosen = ModelSpec { expert_type, dense_type, ..base.clone() };
    if chosen.validate().is_ok() {
        chosen
    } else {
        ModelSpec {
            expert_type: GgmlType::from_name("q4_K").unwrap_or(GgmlType::Q4_0),
            dense_type: GgmlType::F16,
            ..base
        }
    }
}

/// Weights per second a decode step multiplies here, with `threads`
/// compute threads, measured by decoding a probe model in `dir` (removed
/// after): the slowest and the fastest of its runs, and the types the
/// probe used.
pub fn weights_per_second(
    dir: &Path,
    expert_type: GgmlType,
    dense_type: GgmlType,
    threads: u32,
) -> Result<((f64, f64), String)> {
    let spec = probe_spec(expert_type, dense_type);
    let path = dir.join(format!("bmoe-fit-probe-{}.gguf", std::process::id()));
    let _remove = RemoveOnDrop(&path);
    write_model(&spec, &path, &mut |_, _| std::ops::ControlFlow::Continue(()))
        .context("writing the compute probe model")?;
    let files = crate::gguf::ModelFiles::open(&path)?;
    let active = super::ModelShape::of(&files).map_err(anyhow::Error::msg)?.active_weights;
    let options = SessionOptions {
        model: path.clone(),
        threads: threads.max(1),
        tune: false,
        ctx_size: 256,
        batch: 64,
        ubatch: 64,
        n_expert_used: None,
        stream: None,
        repack: Default::default(),
        mtp: None,
        rpc: None,
        sequences: 1,
        // The kernels `bmoe generate` takes by default.
        batch_invariant: false,
    };
    let mut session = Session::open(options).context("opening the compute probe model")?;
    let mut run = |n_predict| {
        let request = GenerateRequest {
            prompt: "the probe".into(),
            n_predict,
            sampling: Sampling { temp: 0.0, ..Sampling::default() },
            continue_context: false,
            keep_logits: false,
            constraint: None,
        };
        session.generate(&request, &mut |_| {}).context("decoding the compute probe model")
    };
    run(WARM_TOKENS)?;
    let (mut slowest, mut fastest) = (0f64, f64::INFINITY);
    for _ in 0..TIMED_RUNS {
        let summary = run(TIMED_TOKENS)?.summary;
        anyhow::ensure!(summary.decode_ns > 0 && summary.decode_tokens > 0, "the compute probe decoded nothing");
        let per_token_s = summary.decode_ns as f64 / 1e9 / summary.decode_tokens as f64;
        (slowest, fastest) = (slowest.max(per_token_s), fastest.min(per_token_s));
    }
    let rates = (active as f64 / slowest, active as f64 / fastest);
    Ok((rates, format!("experts {}, dense {}", spec.expert_type, spec.dense_type)))
}

/// Bytes per second this disk serves reads of `read_size` bytes at random
/// places of `file` from `lanes` readers (O_DIRECT where it works).
pub fn disk_bytes_per_second(file: &Path, read_size: usize, lanes: usize) -> Result<f64> {
    let probe = crate::bench::probe::probe(file, read_size, lanes, DISK_PROBE)
        .with_context(|| format!("probing the disk with {}", file.display()))?;
    Ok(probe.mib_s * 1048576.0)
}

/// The disk probe on the file system of `dir`, for a model not on disk yet:
/// a scratch file of 256 MiB of random bytes written there (removed after).
pub fn disk_bytes_per_second_in(dir: &Path, read_size: usize, lanes: usize) -> Result<f64> {
    use rand::RngCore;
    use std::io::Write;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!(".bmoe-fit-disk-probe-{}", std::process::id()));
    let _remove = RemoveOnDrop(&path);
    let mut out = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let mut chunk = vec![0u8; 1 << 20];
    let mut rng = rand::thread_rng();
    for _ in 0..256 {
        rng.fill_bytes(&mut chunk);
        out.write_all(&chunk).with_context(|| format!("writing {}", path.display()))?;
    }
    out.sync_all().with_context(|| format!("writing {}", path.display()))?;
    drop(out);
    disk_bytes_per_second(&path, read_size, lanes)
}

/// Removes a scratch file however the probe ends.
struct RemoveOnDrop<'a>(&'a Path);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}
