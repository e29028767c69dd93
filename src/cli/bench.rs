//! `bmoe bench`: the memory-capped benchmark harness (see `bmoe::bench`).

use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};
use clap::Args;

use crate::bench::{self, Config, Plan};

/// `bmoe bench`
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The model to measure (e.g. `bmoe make-model --preset bench -o bench.gguf`).
    #[arg(short, long)]
    pub model: PathBuf,
    /// Memory cap in MiB for every run, enforced by a cgroup the harness creates and removes
    /// (needs root); 0 = no cap.
    #[arg(long, default_value_t = 0)]
    pub cap_mb: u64,
    /// Throttle reads from the model's disk to this many MB/s inside the cgroup (needs root), to
    /// emulate a slower device; checked with O_DIRECT and buffered reads before the runs.
    #[arg(long, value_name = "MBPS", conflicts_with = "disk_class")]
    pub disk_mbps: Option<u64>,
    /// Throttle reads as --disk-mbps does, at a device class's speed: ufs (2000 MB/s), nvme (800),
    /// emmc (300) or sd (90).
    #[arg(long, value_name = "CLASS")]
    pub disk_class: Option<String>,
    /// Repetitions of the matrix (interleaved: A B C A B C).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Tokens to generate per run.
    #[arg(short = 'n', long, default_value_t = 64)]
    pub tokens: u32,
    /// Prompt.
    #[arg(short, long, default_value = "The capital of Japan is")]
    pub prompt: String,
    /// A setting to run instead of the default matrix, NAME=FLAGS (repeatable): `generate` flags,
    /// e.g. "c1000=--moe-stream --cache-mb 1000" (a bmoe.toml goes in FLAGS as `--config FILE`).
    /// Default: mmap, stream-cache0, stream-cacheFIXED, stream-auto.
    #[arg(long = "setting", value_name = "NAME=FLAGS")]
    pub configs: Vec<String>,
    /// A configuration run outside the memory cap, interleaved with the others, NAME=FLAGS
    /// (repeatable): the baseline the capped runs are compared with, e.g. "resident=" for the
    /// plain model with all the memory it wants. The table then gives each configuration's
    /// decode and prefill speed as a fraction of the first one's.
    #[arg(long = "uncapped", value_name = "NAME=FLAGS")]
    pub uncapped: Vec<String>,
    /// The fixed cache budget of the default matrix, MiB [default: half the cap, or 1000].
    #[arg(long)]
    pub fixed_mb: Option<u64>,
    /// Flags every run gets, e.g. "-t 2 --io-threads 4".
    #[arg(long, value_name = "FLAGS", default_value = "")]
    pub common: String,
    /// Run the matrix a second time with a CPU hog on one core.
    #[arg(long)]
    pub hog: bool,
    /// Also measure each configuration's quality: `bmoe eval` over this many positions of the bundled
    /// sample text under the same cap, every configuration with flags of its own against the exact
    /// run (streamed with only --common's flags): KL divergence and top-1 agreement beside the speed.
    #[arg(long, value_name = "POSITIONS", num_args = 0..=1, default_missing_value = "128")]
    pub kl: Option<usize>,
    /// Per-run results as CSV.
    #[arg(long, default_value = "bench-results.csv")]
    pub csv: PathBuf,
    /// Where runs keep their metrics files.
    #[arg(long, default_value = "bench-runs")]
    pub work: PathBuf,
}

/// Runs `bmoe bench`.
pub fn bench(args: BenchArgs) -> Result<()> {
    super::interrupt::install()?;
    // A harness stopped by SIGTERM (a timeout, a service manager) must still
    // stop its run and remove its cgroup: treated like Ctrl-C.
    super::interrupt::also_on_sigterm()?;
    if !args.model.is_file() {
        bail!("{}: no such model file", args.model.display());
    }
    if let Some(positions) = args.kl.filter(|&p| p < 2) {
        bail!("--kl {positions}: at least 2 positions (the first token has no prediction to score)");
    }
    let fixed = args.fixed_mb.unwrap_or(if args.cap_mb > 0 { args.cap_mb / 2 } else { 1000 });
    let mut configs = if args.configs.is_empty() {
        bench::default_matrix(fixed)
    } else {
        args.configs.iter().map(|c| Config::parse(c)).collect::<Result<Vec<_>, _>>().map_err(|e| anyhow!(e))?
    };
    for spec in &args.uncapped {
        configs.push(Config::parse(spec).map_err(|e| anyhow!(e))?.uncapped());
    }
    let mut names: Vec<&str> = configs.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        bail!("two configurations are named `{}`: each needs its own name", w[0]);
    }
    let disk = match (&args.disk_class, args.disk_mbps) {
        (Some(name), _) => {
            let class = bench::throttle::disk_class(name).map_err(|e| anyhow!(e))?;
            Some((class.mbps, format!("{} MB/s, {}: {}", class.mbps, class.name, class.what)))
        }
        (None, Some(0)) => bail!("--disk-mbps 0: a speed in MB/s above zero"),
        (None, Some(mbps)) => Some((mbps, format!("{mbps} MB/s"))),
        (None, None) => None,
    };
    let throttle = match &disk {
        Some((mbps, _)) => Some(bench::throttle::throttle_for(&args.model, *mbps).map_err(|e| anyhow!(e))?),
        None => None,
    };
    let lanes = crate::config::RunConfig::default().moe.io_threads as usize;
    eprintln!("bench: probing the disk at the model's slice size (1 and {lanes} lanes)...");
    let probes = bench::probe_disk(&args.model, lanes).map_err(|e| anyhow!(e))?;
    if !bench::drop_page_cache() {
        eprintln!("bench: note: cannot drop the page cache (needs root): runs after the first start warm");
    }
    let mut plan = Plan {
        bmoe: std::env::current_exe()?,
        model: args.model.clone(),
        cap: (args.cap_mb > 0).then_some(args.cap_mb << 20),
        throttle,
        reps: args.reps.max(1),
        tokens: args.tokens,
        prompt: args.prompt.clone(),
        common: args.common.split_whitespace().map(str::to_string).collect(),
        configs,
        work: args.work.clone(),
        lanes,
        pass: "quiet".into(),
    };
    if let (Some((mbps, what)), Some(t)) = (&disk, throttle) {
        let cgroup = plan.cgroup().map_err(|e| anyhow!(e))?.expect("a throttle makes a cgroup");
        let check = bench::throttle::check(&cgroup, &args.model, *mbps).map_err(|e| anyhow!("--disk-mbps: {e}"))?;
        let (major, minor) = t.device;
        eprintln!(
            "bench: reads from disk {major}:{minor} throttled to {what}; measured inside: O_DIRECT {:.0} MB/s, \
             buffered {:.0} MB/s",
            check.direct_mbps, check.buffered_mbps
        );
        if !check.holds(*mbps) {
            eprintln!(
                "bench: warning: the throttle does not hold (reads ran faster than {mbps} MB/s): the kernel's \
                 throttle may not reach this disk's reads; the runs measure the disk's own speed"
            );
        }
    }
    let cap = match (args.cap_mb, &disk) {
        (0, None) => "no cap".to_string(),
        (0, Some((mbps, _))) => format!("no memory cap, the disk at {mbps} MB/s"),
        (cap, None) => format!("a {cap} MiB cap"),
        (cap, Some((mbps, _))) => format!("a {cap} MiB cap, the disk at {mbps} MB/s"),
    };
    eprintln!("bench: {} configurations x {} reps, {} tokens each, {cap}", plan.configs.len(), plan.reps, plan.tokens);
    let mut progress = |r: &bench::RunResult, i: usize, n: usize| {
        let speed = r.get("decode_tok_s").map_or_else(|| "-".into(), |t| format!("{t:.2} tok/s"));
        let status = if r.ok { speed } else { format!("FAILED: {}", r.error.as_deref().unwrap_or("?")) };
        eprintln!("bench: [{i}/{n}] {} {} rep {}: {status}", r.pass, r.config, r.rep);
    };
    let mut results = bench::run(&plan, &mut progress).map_err(|e| anyhow!(e))?;
    if args.hog && !super::interrupt::requested() {
        let _hog = bench::Hog::start().map_err(|e| anyhow!(e))?;
        plan.pass = "hog".into();
        eprintln!("bench: again with a CPU hog on one core");
        results.extend(bench::run(&plan, &mut progress).map_err(|e| anyhow!(e))?);
    }
    let summaries = bench::summarize(&results);
    print!("{}", bench::table(&summaries, &probes));
    if let Some(positions) = args.kl.filter(|_| !super::interrupt::requested()) {
        eprintln!("bench: quality of each configuration against the exact run ({positions} positions)");
        plan.pass = "quiet".into();
        let failed: Vec<String> =
            summaries.iter().filter(|s| s.pass == "quiet" && s.ok == 0).map(|s| s.config.clone()).collect();
        let quality = bench::quality::measure(&plan, positions, &failed).map_err(|e| anyhow!("--kl: {e}"))?;
        print!("{}", bench::quality::table(&quality, &summaries, "quiet", positions));
    }
    bench::write_csv(&args.csv, &results)?;
    eprintln!("bench: per-run results in {}", args.csv.display());
    super::interrupt::check()?;
    Ok(())
}
