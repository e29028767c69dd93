//! The memory-capped benchmark harness (`bmoe bench`): a matrix of
//! configurations run as separate `bmoe generate` processes inside a cgroup
//! with a memory cap, the page cache dropped before each run, repetitions
//! interleaved (A B C A B C), and a table and CSV of what each run measured.
//! A disk probe first measures what the storage gives at the model's slice
//! size, so read speed is reported as a fraction of it.

pub mod cgroup;
pub mod probe;
pub mod quality;
mod report;
pub mod throttle;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

pub use report::{Summary, summarize, table, write_csv};

use crate::gguf::ModelFiles;
use crate::moe::recipe::parse_expert_tensor;
use cgroup::Cgroup;
use probe::Probe;

/// One configuration of the matrix: a name and its `bmoe generate` flags.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Short name for the table.
    pub name: String,
    /// Flags added to `bmoe generate`.
    pub flags: Vec<String>,
    /// Runs inside the memory cap (false: a baseline run outside it, such
    /// as the resident model the capped runs are compared with).
    pub capped: bool,
}

impl Config {
    /// `NAME=FLAGS...` as given to `--setting` or `--uncapped`.
    pub fn parse(spec: &str) -> Result<Config, String> {
        let (name, flags) = spec.split_once('=').ok_or_else(|| format!("`{spec}` is not NAME=FLAGS"))?;
        if name.trim().is_empty() {
            return Err(format!("`{spec}` has no name"));
        }
        Ok(Config {
            name: name.trim().into(),
            flags: flags.split_whitespace().map(str::to_string).collect(),
            capped: true,
        })
    }

    /// The same configuration, run outside the memory cap.
    pub fn uncapped(self) -> Config {
        Config { capped: false, ..self }
    }
}

/// The default matrix: plain mmap, streaming without a cache, with a fixed
/// cache of `fixed_mb`, and with the automatic budget.
pub fn default_matrix(fixed_mb: u64) -> Vec<Config> {
    let c = |name: &str, flags: &[&str]| Config {
        name: name.into(),
        flags: flags.iter().map(|f| f.to_string()).collect(),
        capped: true,
    };
    vec![
        // llama.cpp's mapping, whatever the model's size (the default,
        // `moe.stream = auto`, would stream a model over the cap).
        c("mmap", &["--moe-stream=off"]),
        c("stream-cache0", &["--moe-stream", "--cache-mb", "0"]),
        Config {
            name: format!("stream-cache{fixed_mb}"),
            flags: vec!["--moe-stream".into(), "--cache-mb".into(), fixed_mb.to_string()],
            capped: true,
        },
        c("stream-auto", &["--moe-stream", "--cache-mb", "auto"]),
    ]
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The `bmoe` binary to run.
    pub bmoe: PathBuf,
    /// The model.
    pub model: PathBuf,
    /// Memory cap in bytes; None runs without a cgroup (unless throttled).
    pub cap: Option<u64>,
    /// Reads from the model's disk throttled inside the cgroup (an
    /// emulated slower disk); None: the disk's own speed.
    pub throttle: Option<cgroup::ReadThrottle>,
    /// Repetitions of the whole matrix.
    pub reps: usize,
    /// Tokens to generate per run.
    pub tokens: u32,
    /// Prompt.
    pub prompt: String,
    /// Flags every run gets (threads, io threads...).
    pub common: Vec<String>,
    /// The matrix.
    pub configs: Vec<Config>,
    /// Where run outputs go.
    pub work: PathBuf,
    /// Read lanes to probe with besides one.
    pub lanes: usize,
    /// Label of this pass (`quiet`, `hog`).
    pub pass: String,
}

impl Plan {
    /// The cgroup the capped configurations run in, if the plan caps
    /// memory or throttles the disk.
    pub fn cgroup(&self) -> Result<Option<Cgroup>, String> {
        if self.cap.is_none() && self.throttle.is_none() {
            return Ok(None);
        }
        Cgroup::with_limits(self.cap, self.throttle).map(Some)
    }
}

/// What one run measured; None where the run did not report it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunResult {
    /// Pass label.
    pub pass: String,
    /// Configuration name.
    pub config: String,
    /// Repetition (1-based).
    pub rep: usize,
    /// The run exited normally.
    pub ok: bool,
    /// The OOM killer killed it.
    pub oom_killed: bool,
    /// Why it failed, when it did.
    pub error: Option<String>,
    /// It ran outside the memory cap.
    pub uncapped: bool,
    /// `# summary` and `# open` fields of its CSV.
    pub fields: BTreeMap<String, String>,
    /// Peak memory of the cgroup during the run, bytes.
    pub cgroup_peak: Option<u64>,
}

impl RunResult {
    /// A numeric field.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.fields.get(key)?.parse().ok().filter(|v: &f64| v.is_finite())
    }
}

/// The largest per-expert slice of one projection in the model, bytes.
pub fn slice_bytes(model: &Path) -> Result<usize, String> {
    let files = ModelFiles::open(model).map_err(|e| e.to_string())?;
    let n_expert = files.meta().arch_u64("expert_count").filter(|&n| n > 0).ok_or("the model has no experts")?;
    files
        .tensors()
        .filter(|t| parse_expert_tensor(&t.info.name).is_some())
        .map(|t| (t.info.size / n_expert) as usize)
        .max()
        .ok_or_else(|| "no expert tensors found".into())
}

/// Probes the disk with one lane and with `lanes`.
pub fn probe_disk(model: &Path, lanes: usize) -> Result<Vec<Probe>, String> {
    let slice = slice_bytes(model)?;
    let mut out = Vec::new();
    for n in [1, lanes.max(2)] {
        drop_page_cache();
        out.push(probe::probe(model, slice, n, Duration::from_secs(2)).map_err(|e| format!("disk probe: {e}"))?);
    }
    Ok(out)
}

/// Asks the kernel to drop clean page-cache pages, so each run starts cold.
/// Returns false where that is not permitted.
pub fn drop_page_cache() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// Runs the matrix `plan.reps` times, interleaved, calling `progress` with
/// each run's result as it finishes.
pub fn run(plan: &Plan, progress: &mut dyn FnMut(&RunResult, usize, usize)) -> Result<Vec<RunResult>, String> {
    std::fs::create_dir_all(&plan.work).map_err(|e| format!("creating {}: {e}", plan.work.display()))?;
    let cgroup = plan.cgroup()?;
    let total = plan.reps * plan.configs.len();
    let mut results = Vec::with_capacity(total);
    for rep in 1..=plan.reps {
        for config in &plan.configs {
            let result = run_one(plan, config, rep, cgroup.as_ref().filter(|_| config.capped));
            progress(&result, results.len() + 1, total);
            results.push(result);
            if crate::interrupt::requested() {
                return Ok(results);
            }
        }
    }
    Ok(results)
}

/// One run of one configuration.
fn run_one(plan: &Plan, config: &Config, rep: usize, cgroup: Option<&Cgroup>) -> RunResult {
    let csv = plan.work.join(format!("{}-{}-{rep}.csv", plan.pass, config.name));
    let _ = std::fs::remove_file(&csv);
    let mut result = RunResult {
        pass: plan.pass.clone(),
        config: config.name.clone(),
        rep,
        uncapped: !config.capped,
        ..RunResult::default()
    };
    drop_page_cache();
    let oom_before = cgroup.map_or(0, Cgroup::oom_kills);
    if let Some(cg) = cgroup {
        cg.reset_peak();
    }
    let mut args: Vec<String> = vec![
        "generate".into(),
        "-m".into(),
        plan.model.display().to_string(),
        "-p".into(),
        plan.prompt.clone(),
        "-n".into(),
        plan.tokens.to_string(),
        "--csv".into(),
        csv.display().to_string(),
    ];
    args.extend(plan.common.iter().cloned());
    args.extend(config.flags.iter().cloned());
    let mut command = bmoe_command(&plan.bmoe, cgroup);
    command.args(&args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    match run_stoppable(command) {
        Err(e) => result.error = Some(format!("starting {}: {e}", plan.bmoe.display())),
        Ok(out) => {
            result.ok = out.status.success();
            result.oom_killed = cgroup.is_some_and(|cg| cg.oom_kills() > oom_before);
            if !result.ok {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").to_string();
                result.error = Some(if result.oom_killed { "killed by the OOM killer".into() } else { last });
            }
        }
    }
    result.cgroup_peak = cgroup.and_then(Cgroup::peak);
    if let Ok(text) = std::fs::read_to_string(&csv) {
        result.fields = csv_fields(&text);
    }
    result
}

/// A command that runs `bmoe` inside `cgroup` (when given): it joins the
/// cgroup before it becomes bmoe, so all of it is capped.
fn bmoe_command(bmoe: &Path, cgroup: Option<&Cgroup>) -> Command {
    match cgroup {
        Some(cg) => in_cgroup(cg, bmoe.as_os_str()),
        None => Command::new(bmoe),
    }
}

/// A command that runs `program` inside `cgroup`, joined before it starts
/// (the shell writes its own pid, then becomes the program).
fn in_cgroup(cgroup: &Cgroup, program: &std::ffi::OsStr) -> Command {
    let procs: Vec<String> = cgroup.procs_files().iter().map(|p| p.display().to_string()).collect();
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("for f in $BMOE_CGROUP_PROCS; do echo $$ > \"$f\" || exit 125; done; exec \"$@\"")
        .arg("sh")
        .arg(program)
        .env("BMOE_CGROUP_PROCS", procs.join(" "));
    c
}

/// Runs `command` to its end, like `Command::output`, except that a stop
/// request (Ctrl-C or SIGTERM to the harness) is passed on to the run as
/// SIGINT, so it writes its metrics and exits and the harness can remove
/// its cgroup instead of leaving it behind.
fn run_stoppable(mut command: Command) -> std::io::Result<std::process::Output> {
    let mut child = command.spawn()?;
    let mut stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(e) = stderr.as_mut() {
            let _ = std::io::Read::read_to_end(e, &mut text);
        }
        text
    });
    let mut passed_on = false;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if crate::interrupt::requested() && !passed_on {
            passed_on = true;
            // Our own child, not yet reaped: the pid is still its.
            if let Some(pid) = i32::try_from(child.id()).ok().and_then(rustix::process::Pid::from_raw) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = reader.join().unwrap_or_default();
    Ok(std::process::Output { status, stdout: Vec::new(), stderr })
}

/// The `key=value` fields of a metrics CSV's `# open` and `# summary` lines.
pub fn csv_fields(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# open ").or_else(|| line.strip_prefix("# summary ")) else { continue };
        for kv in rest.split_whitespace() {
            if let Some((k, v)) = kv.split_once('=') {
                out.insert(k.to_string(), v.to_string());
            }
        }
    }
    out
}

/// Starts a busy process on the last core (pinned where `taskset` exists);
/// it ends when the returned guard drops.
pub struct Hog(std::process::Child);

impl Hog {
    /// Starts the hog.
    pub fn start() -> Result<Hog, String> {
        let core = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
        let busy = ["sh", "-c", "while :; do :; done"];
        let child = Command::new("taskset")
            .arg("-c")
            .arg(core.to_string())
            .args(busy)
            .spawn()
            .or_else(|_| Command::new(busy[0]).args(&busy[1..]).spawn())
            .map_err(|e| format!("starting the CPU hog: {e}"))?;
        Ok(Hog(child))
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_configs_and_csv_fields() {
        let c = Config::parse("anon=--moe-stream --dense-weights anon").unwrap();
        assert_eq!(c.name, "anon");
        assert_eq!(c.flags, ["--moe-stream", "--dense-weights", "anon"]);
        assert!(c.capped && !c.uncapped().capped);
        assert!(Config::parse("no-equals").is_err());
        let text = "# open arch=qwen3moe load_s=1.5 open_read_mib=600.00\nturn,phase\n0,1\n# summary tokens=64 decode_tok_s=6.390 hit_pct=nan\n";
        let f = csv_fields(text);
        assert_eq!(f["decode_tok_s"], "6.390");
        assert_eq!(f["open_read_mib"], "600.00");
        let r = RunResult { fields: f, ..RunResult::default() };
        assert_eq!(r.get("tokens"), Some(64.0));
        assert_eq!(r.get("hit_pct"), None, "nan is not a number to report");
        assert_eq!(default_matrix(1000)[2].flags, ["--moe-stream", "--cache-mb", "1000"]);
    }
}
