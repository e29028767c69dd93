//! `bmoe fit -m MODEL` / `bmoe fit -hf REPO[:QUANT]`: whether a model runs
//! on this machine, resident or streamed, with which cache, reading how many
//! bytes a token and at what speed; from a repository before pulling (its
//! headers read by range requests), with the repository's other
//! quantizations beside it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow, bail};
use clap::Args;

use crate::config::RunConfig;
use crate::fit::{Estimate, Machine, Mode, ModelShape, estimate, probe};
use crate::gguf::ModelFiles;
use crate::hub::{self, HubSettings, HubSpec, ModelRef};
use crate::moe::budget::MemoryLimits;
use crate::units::{size, sizes};

/// `bmoe fit`'s arguments.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["model", "hf"])))]
pub struct FitArgs {
    /// A model file (first shard of a split set), or hf:OWNER/NAME[:QUANT].
    #[arg(short = 'm', long)]
    pub model: Option<String>,
    /// A model on the Hugging Face Hub, OWNER/NAME[:QUANT] (as `pull` takes it); only its headers
    /// are read, by range requests: nothing is downloaded.
    #[arg(long = "hf", value_name = "OWNER/NAME[:QUANT]")]
    pub hf: Option<String>,
    /// Context length to leave room for [default: generate.ctx_size's, 4096].
    #[arg(short = 'c', long)]
    pub ctx_size: Option<u32>,
    /// Requests served at once (`bmoe serve --parallel`), each with the whole context: the KV
    /// cache is that many contexts [default: 1].
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub parallel: u32,
    /// Compute threads for the compute probe [default: every core].
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
    /// Estimate for this much memory (MiB) instead of this machine's (a smaller device, a cap).
    #[arg(long, value_name = "MIB")]
    pub mem_mb: Option<u64>,
    /// Take the disk to read this many MB/s (10^6 bytes) instead of probing it (another device:
    /// NVMe ~800-3000, UFS ~2000, eMMC ~300, microSD ~90).
    #[arg(long, value_name = "MB/S")]
    pub disk_mbps: Option<f64>,
    /// Take compute to multiply this many billion weights a second in a decode step instead of
    /// measuring it (another device; `fit` on it prints its own figure).
    #[arg(long, value_name = "G")]
    pub compute_gws: Option<f64>,
}

/// The model as `fit` reads it: local headers, or a hub repository's.
struct Subject {
    files: ModelFiles,
    /// How to name it in the report.
    name: String,
    /// What was read to describe it.
    source: String,
    /// A file on disk to probe the disk with, else the folder it would go to.
    disk: Result<PathBuf, PathBuf>,
    /// The repository and its files, when known.
    repo: Option<(String, Vec<hub::RepoFile>)>,
    /// How a run names it: `-m PATH` or `-hf SPEC`.
    run_as: String,
}

/// Runs `bmoe fit`.
pub fn fit(args: FitArgs) -> Result<()> {
    let defaults = RunConfig::default();
    let n_ctx = args.ctx_size.unwrap_or(defaults.generate.ctx_size);
    if !(16..=1 << 20).contains(&n_ctx) {
        bail!("--ctx-size must be between 16 and 1048576 (got {n_ctx})");
    }
    if !(1..=64).contains(&args.parallel) {
        bail!("--parallel must be 1 to 64 (got {})", args.parallel);
    }
    if args.disk_mbps.is_some_and(|d| !(d.is_finite() && d > 0.0)) {
        bail!("--disk-mbps must be a positive number of MB/s");
    }
    if args.compute_gws.is_some_and(|g| !(g.is_finite() && g > 0.0)) {
        bail!("--compute-gws must be a positive number of billions of weights a second");
    }
    let subject = subject(&args)?;
    let shape = ModelShape::of(&subject.files).map_err(|e| anyhow!("{}: {e}", subject.name))?;
    let memory = match args.mem_mb {
        Some(0) => bail!("--mem-mb must be above 0"),
        Some(mb) => MemoryLimits { available: Some(mb << 20), cgroup_limit: None, cgroup: None },
        None => MemoryLimits::read(),
    };
    let lanes = defaults.moe.io_threads as usize;
    let read_size = shape.read_size.max(4096) as usize;
    let (disk_bytes_s, disk_line) = match args.disk_mbps {
        Some(mbps) => (Some(mbps * 1e6), format!("{mbps:.0} MB/s as given (--disk-mbps)")),
        None => {
            crate::notes::note(
                "bmoe",
                &format!("fit: probing the disk ({lanes} lanes of {} reads)", read_text(read_size)),
            );
            let probed = match &subject.disk {
                Ok(file) => probe::disk_bytes_per_second(file, read_size, lanes).map(|r| (r, "the model's file")),
                Err(dir) => probe::disk_bytes_per_second_in(dir, read_size, lanes).map(|r| (r, "a scratch file there")),
            };
            match probed {
                Ok((rate, on)) => (
                    Some(rate),
                    format!("{:.0} MiB/s for {} reads, {lanes} lanes ({on})", rate / 1048576.0, read_text(read_size)),
                ),
                Err(e) => (None, format!("not measured: {e:#}")),
            }
        }
    };
    let threads = args.threads.unwrap_or_else(|| defaults.threads()).max(1);
    let (weights_s, compute_line) = match args.compute_gws {
        Some(g) => (Some((g * 1e9, g * 1e9)), format!("{g:.1} G weights/s as given (--compute-gws)")),
        None => {
            crate::notes::note(
                "bmoe",
                &format!(
                    "fit: measuring compute (a 2-layer probe model in {}/{}, {threads} threads)",
                    shape.expert_type, shape.dense_type
                ),
            );
            let probe_dir = crate::moe::copies::cache_root();
            let _ = std::fs::create_dir_all(&probe_dir);
            match probe::weights_per_second(&probe_dir, shape.expert_type, shape.dense_type, threads) {
                Ok(((slow, fast), types)) => (
                    Some((slow, fast)),
                    format!("{:.1}-{:.1} G weights/s ({types}, {threads} threads)", slow / 1e9, fast / 1e9),
                ),
                Err(e) => (None, format!("not measured: {e:#}")),
            }
        }
    };
    let machine = Machine { memory, disk_bytes_s, weights_s };
    // Each request served at once holds a whole context (and the default,
    // batch-invariant server one spare context more).
    let positions = crate::fit::served_positions(n_ctx, args.parallel, true);
    let chosen = estimate(&shape, &machine, positions);
    let mut out = String::new();
    let _ = writeln!(out, "model:     {} ({})", subject.name, subject.source);
    let _ = writeln!(out, "shape:     {}", shape_line(&shape));
    let _ = writeln!(out, "memory:    {}", memory_line(&machine.memory, args.mem_mb.is_some()));
    let _ = writeln!(out, "disk:      {disk_line}");
    let _ = writeln!(out, "compute:   {compute_line}");
    let kv = shape.kv_per_position * u64::from(positions);
    let each = if args.parallel > 1 { format!(" x {} requests at once", args.parallel) } else { String::new() };
    let _ = writeln!(out, "context:   {n_ctx} tokens{each}: KV cache {} (f16 keys and values)", size(kv));
    write_estimate(&mut out, &shape, &chosen, positions);
    let run = run_line(&subject.run_as, &chosen.mode, args.ctx_size, args.mem_mb.is_some());
    let run = if args.parallel > 1 {
        run.replacen("bmoe chat", "bmoe serve", 1).replacen("   (", &format!(" --parallel {}   (", args.parallel), 1)
    } else {
        run
    };
    let _ = writeln!(out, "run it:    {run}");
    if let Some(line) = space_line(&subject, &shape) {
        let _ = writeln!(out, "space:     {line}");
    }
    if let Some((repo, files)) = &subject.repo {
        write_alternatives(&mut out, repo, files, &subject, &shape, &machine, &chosen, n_ctx);
    }
    let _ = writeln!(
        out,
        "\nAn estimate from the header and this machine's probes (docs/models.md, \"What fits\"); \
         `bmoe bench -m MODEL` measures the real thing."
    );
    super::print_stdout(&out)
}

/// Reads the model's headers: from disk, from the hub cache when offline,
/// else from the hub by range requests.
fn subject(args: &FitArgs) -> Result<Subject> {
    let given = match (&args.hf, &args.model) {
        (Some(hf), _) => Some(hf.strip_prefix("hf:").unwrap_or(hf).parse::<HubSpec>().map_err(|e| anyhow!(e))?),
        (None, Some(m)) => match ModelRef::parse(m).map_err(|e| anyhow!(e))? {
            ModelRef::Hub(spec) => Some(spec),
            ModelRef::File(_) => None,
        },
        (None, None) => None,
    };
    let settings = HubSettings::from_env();
    let Some(spec) = given else {
        let path = PathBuf::from(args.model.as_deref().unwrap_or_default());
        if !path.is_file() {
            bail!(
                "{}: no such file; pass -m a GGUF model file, a hub model (OWNER/NAME[:QUANT], or a name `bmoe \
                 models` lists) or -hf OWNER/NAME[:QUANT]",
                path.display()
            );
        }
        return local(&path, None, &settings);
    };
    // Pulled already: read it here (the hub lists its other quantizations).
    if let Ok((_, files)) = hub::cached_files(&spec, &settings.cache) {
        return local(&files[0], Some(spec.to_string()), &settings);
    }
    if settings.offline {
        let pulled = hub::pull(&spec, &settings)?;
        return local(&pulled.model, Some(spec.to_string()), &settings);
    }
    let remote = hub::read_headers(&spec, &settings)?;
    let total: u64 = remote.listing.files.iter().filter(|f| remote.chosen.contains(&f.name)).map(|f| f.size).sum();
    let [read, total_s] = sizes([remote.bytes_read, total]);
    Ok(Subject {
        name: format!("{spec}: {}", remote.chosen.join(", ")),
        source: format!("headers read from the hub: {read} of {total_s}, nothing downloaded"),
        files: remote.files,
        run_as: format!("-hf {}", shell_word(&spec.to_string())),
        disk: Err(settings.cache.clone()),
        repo: Some((spec.repo.clone(), remote.listing.files)),
    })
}

/// A model on disk; the repository's listing too when it is in the hub
/// cache and the hub answers.
fn local(path: &Path, name: Option<String>, settings: &HubSettings) -> Result<Subject> {
    let files = ModelFiles::open(path)?;
    let repo = hub::repo_of(path).filter(|_| !settings.offline).and_then(|repo| {
        let client = hub::HubClient::new(settings).ok()?;
        match client.listing(&repo, "main") {
            Ok(listing) => Some((repo, listing.files)),
            Err(e) => {
                eprintln!("bmoe: fit: {repo}'s other quantizations are not listed: {e}");
                None
            }
        }
    });
    let run_as = match &name {
        Some(spec) => format!("-hf {}", shell_word(spec)),
        None => format!("-m {}", shell_word(&path.display().to_string())),
    };
    Ok(Subject {
        run_as,
        name: name.unwrap_or_else(|| path.display().to_string()),
        source: format!("{} on disk", size(files.total_bytes())),
        disk: Ok(path.to_path_buf()),
        files,
        repo,
    })
}

/// The command that runs the model as estimated, with the flags it needs
/// (none for streaming: `moe.stream = auto` decides it at open), and what
/// it will do.
fn run_line(run_as: &str, mode: &Mode, ctx_size: Option<u32>, other_memory: bool) -> String {
    let ctx = ctx_size.map(|c| format!(" --ctx-size {c}")).unwrap_or_default();
    let there = if other_memory { " with that memory" } else { "" };
    match mode {
        Mode::Resident => format!("bmoe chat {run_as}{ctx}   (resident{there}: it fits)"),
        Mode::Streamed { .. } => {
            format!("bmoe chat {run_as}{ctx}   (streams by itself{there}: moe.stream = auto sees it does not fit)")
        }
        Mode::DoesNotFit { .. } => {
            "not with this memory: a smaller quantization (or --ctx-size) first; --moe-stream tries anyway".into()
        }
    }
}

/// `word` as one shell word: quoted when it holds anything a shell reads.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// A read's size: KiB below a MiB.
fn read_text(bytes: usize) -> String {
    if bytes < 1 << 20 { format!("{} KiB", bytes.div_ceil(1024)) } else { size(bytes as u64) }
}

fn shape_line(shape: &ModelShape) -> String {
    let [file, bank, dense, routed] = sizes([shape.file_bytes, shape.bank, shape.dense, shape.working_set]);
    format!(
        "{}, {file}: experts {bank} ({}), dense {dense}, {} of {} experts routed a token ({routed})",
        shape.arch, shape.expert_type, shape.k, shape.n_expert
    )
}

fn memory_line(memory: &MemoryLimits, given: bool) -> String {
    if given {
        return format!("{} as given (--mem-mb)", size(memory.available.unwrap_or(0)));
    }
    match (memory.available, memory.cgroup_limit) {
        (Some(a), Some(c)) if c < a => {
            let [a, c] = sizes([a, c]);
            format!("{c}: the cgroup limit ({}), below the {a} available", memory.cgroup.as_deref().unwrap_or("?"))
        }
        (Some(a), _) => format!("{} available", size(a)),
        (None, Some(c)) => format!("{}: the cgroup limit", size(c)),
        (None, None) => "unknown here".into(),
    }
}

/// The verdict, cache, reads and speed.
fn write_estimate(out: &mut String, shape: &ModelShape, e: &Estimate, n_ctx: u32) {
    let [dense, context] = sizes([e.dense, e.context]);
    match &e.mode {
        Mode::Resident => {
            let _ = writeln!(
                out,
                "runs:      resident: the whole file fits beside a {n_ctx}-token context ({context} with the runtime)"
            );
        }
        Mode::Streamed { budget, .. } => {
            let share = 100.0 * *budget as f64 / shape.bank.max(1) as f64;
            let _ = writeln!(
                out,
                "runs:      streamed: dense weights {dense} and context {context} resident, experts read from disk \
                 through a cache of {} ({share:.0}% of the experts; --cache-mb auto)",
                size(*budget)
            );
            let [most, fewest] = sizes([e.read_per_token.0, e.read_per_token.1]);
            let _ = writeln!(
                out,
                "reads:     {fewest} to {most} a token (cache hits {:.0}-{:.0}%, as the live policy hit on real \
                 models' route traces at this share)",
                e.hit.0 * 100.0,
                e.hit.1 * 100.0
            );
        }
        Mode::DoesNotFit { need } => {
            let _ = writeln!(
                out,
                "runs:      no: streaming needs the dense weights {dense}, the context {context} and one token's \
                 experts {} resident beside the margin kept free, about {} in all (a smaller --ctx-size or \
                 quantization needs less)",
                size(shape.working_set),
                size(*need)
            );
        }
    }
    let speed = match (e.tok_s, e.compute_s) {
        (Some((slow, fast)), Some((most, _))) if fast - slow < 0.005 * fast => {
            format!("about {slow:.1} tok/s ({} of compute a token)", ms(most))
        }
        (Some((slow, fast)), Some((most, least))) if matches!(e.mode, Mode::Resident) => {
            format!("{slow:.1} to {fast:.1} tok/s ({} to {} of compute a token)", ms(least), ms(most))
        }
        (Some((slow, fast)), Some((most, least))) => format!(
            "{slow:.1} to {fast:.1} tok/s ({} to {} of compute a token; reads waited for in full, or hidden \
             behind it)",
            ms(least),
            ms(most)
        ),
        _ if matches!(e.mode, Mode::DoesNotFit { .. }) => "-".into(),
        _ => "not estimated (a probe failed)".into(),
    };
    let _ = writeln!(out, "speed:     {speed}");
}

/// Seconds as milliseconds, with a decimal below 10.
fn ms(seconds: f64) -> String {
    let ms = seconds * 1e3;
    if ms < 10.0 { format!("{ms:.1} ms") } else { format!("{ms:.0} ms") }
}

/// Disk room for the file (when not on disk yet) and its repacked copy.
fn space_line(subject: &Subject, shape: &ModelShape) -> Option<String> {
    let dir = match &subject.disk {
        Ok(file) => file.parent()?.to_path_buf(),
        Err(dir) => dir.clone(),
    };
    let probe_at = dir.ancestors().find(|d| d.exists())?;
    let free = hub::free_bytes(probe_at)?;
    let needed = if subject.disk.is_ok() { 0 } else { shape.file_bytes };
    let [free_s, needed_s, copy] = sizes([free, needed, shape.bank]);
    let verdict = if needed > free {
        "the file does not fit: free space or set HF_HOME to a larger disk"
    } else if needed + shape.bank > free {
        "the file fits; its repacked copy will not (experts are repacked as read instead)"
    } else {
        "fits"
    };
    Some(if needed > 0 {
        format!("{free_s} free at {}; the file {needed_s}, its repacked copy up to {copy}: {verdict}", dir.display())
    } else {
        format!("{free_s} free at {}; its repacked copy up to {copy}: {verdict}", dir.display())
    })
}

/// The repository's other quantizations, estimated by scaling this one's
/// sizes, and which would run faster.
#[allow(clippy::too_many_arguments)]
fn write_alternatives(
    out: &mut String,
    repo: &str,
    files: &[hub::RepoFile],
    subject: &Subject,
    shape: &ModelShape,
    machine: &Machine,
    chosen: &Estimate,
    n_ctx: u32,
) {
    let quants = hub::quantization_sizes(files);
    if quants.len() < 2 {
        return;
    }
    let _ = writeln!(out, "\n{repo}'s quantizations (sizes scaled from this one's header; smaller ones lose quality):");
    let mid = |e: &Estimate| e.tok_s.map(|(a, b)| (a + b) / 2.0);
    let mut faster = Vec::new();
    for (tag, bytes) in &quants {
        let this = subject.name.to_ascii_lowercase().contains(&tag.to_ascii_lowercase())
            && (*bytes as f64 - shape.file_bytes as f64).abs() < shape.file_bytes as f64 * 0.001;
        let e = if this { chosen.clone() } else { estimate(&shape.scaled_to(*bytes), machine, n_ctx) };
        let mode = match &e.mode {
            Mode::Resident => "resident".to_string(),
            Mode::Streamed { .. } => format!("streamed, {} a token", size(e.read_per_token.1)),
            Mode::DoesNotFit { .. } => "does not fit".to_string(),
        };
        let speed = match e.tok_s {
            Some((a, b)) if b - a < 0.005 * b => format!("{a:.1} tok/s"),
            Some((a, b)) => format!("{a:.1}-{b:.1} tok/s"),
            None => "-".to_string(),
        };
        let _ = writeln!(
            out,
            "  {:<10} {:>10}  {mode:<28} {speed}{}",
            tag,
            size(*bytes),
            if this { "  (this one)" } else { "" }
        );
        if !this
            && let (Some(m), Some(c)) = (mid(&e), mid(chosen))
            && m > c * 1.1
        {
            faster.push(format!("{tag} ({m:.1} tok/s)"));
        }
    }
    if !faster.is_empty() {
        let _ = writeln!(out, "faster here: {}", faster.join(", "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_line_names_the_model_as_a_shell_reads_it_and_needs_no_stream_flag() {
        assert_eq!(shell_word("/m/q30.gguf"), "/m/q30.gguf");
        assert_eq!(shell_word("acme/Chat-MoE-GGUF:Q8_0"), "acme/Chat-MoE-GGUF:Q8_0");
        assert_eq!(shell_word("/my models/it's.gguf"), "'/my models/it'\\''s.gguf'");
        let streamed = Mode::Streamed { budget: 1 << 30, why: None };
        let line = run_line("-m /m/q30.gguf", &streamed, None, false);
        assert!(line.starts_with("bmoe chat -m /m/q30.gguf   (streams by itself"), "{line}");
        assert!(!line.contains("--moe-stream"), "{line}");
        let line = run_line("-hf acme/X:Q8_0", &Mode::Resident, Some(8192), true);
        assert!(line.starts_with("bmoe chat -hf acme/X:Q8_0 --ctx-size 8192   (resident with that memory"), "{line}");
        assert!(run_line("-m x", &Mode::DoesNotFit { need: 1 }, None, false).starts_with("not with this memory"));
    }
}
