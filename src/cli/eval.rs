//! `bmoe eval`: what lossy settings cost. The exact run and each setting
//! are teacher-forced over the same text (`bmoe::eval`), and each setting
//! is summed up as its KL divergence from the exact run per position (mean,
//! median, 99th percentile, max) and how often both put the same token
//! first, beside its decode speed and bytes read per token.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};
use clap::{Args, Parser};

use super::generate::{RunFlags, TurnFlags, open_host, resolve_config};
use crate::eval::{self, KlStats, Position, Reference, kl_text};
use crate::interrupt::{self, Forward};
use crate::telemetry::summary::RunSummary;

/// `bmoe eval`
#[derive(Args, Debug)]
pub struct EvalArgs {
    /// The text to score, teacher-forced (UTF-8 file) [default: a bundled sample of English prose].
    #[arg(long, value_name = "FILE")]
    pub text: Option<PathBuf>,
    /// Positions to score from the start of the text (fewer if the text or the context is shorter).
    #[arg(long, default_value_t = 256)]
    pub tokens: usize,
    /// A setting to measure against the exact run: `generate` flags added to the others,
    /// optionally named, `[NAME=]FLAGS` (repeatable), e.g. "top2=--n-expert-used 2" or
    /// "--drop-plugin drop-cold --drop-param F=0.6".
    #[arg(long, value_name = "[NAME=]FLAGS", required_unless_present = "branches", allow_hyphen_values = true)]
    pub against: Vec<String>,
    /// Print, per layer, how large the MoE branch's output is against the residual stream it is
    /// added to (RMS of each, and their ratio), over the same text on the exact run's model.
    #[arg(long)]
    pub branches: bool,
    /// Write every position's KL divergence and top-1 agreement per setting to this CSV file.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// The exact run's model and settings (each setting starts from them).
    #[command(flatten)]
    pub run: RunFlags,
}

/// A setting's flags parsed on top of the exact run's.
#[derive(Parser, Debug)]
#[command(no_binary_name = true)]
struct SettingFlags {
    #[command(flatten)]
    run: RunFlags,
}

/// One setting to measure.
#[derive(Debug)]
pub(super) struct Setting {
    /// Its name in the table.
    pub name: String,
    /// The flags it runs with (the exact run's and its own).
    pub flags: RunFlags,
}

/// One measured run: its figures, and per position how it compared.
pub(super) struct Measured {
    name: String,
    positions: Vec<Position>,
    summary: RunSummary,
}

/// Parses `[NAME=]FLAGS` on top of `base`; every setting is checked before
/// any model runs.
fn parse_setting(spec: &str, base: &RunFlags) -> Result<Setting> {
    let (name, flags) = match spec.split_once('=') {
        Some((name, flags)) if !name.is_empty() && !name.starts_with('-') && !name.contains(' ') => {
            (name.to_string(), flags)
        }
        _ => (spec.trim().to_string(), spec),
    };
    let words: Vec<&str> = flags.split_whitespace().collect();
    if words.is_empty() {
        bail!("--against {spec:?}: no flags (the exact run is measured anyway)");
    }
    // Parsed alone, then laid over the exact run's flags (clap's own update
    // would turn the exact run's switches off where the setting omits them).
    let parsed = SettingFlags::try_parse_from(&words).map_err(|e| {
        let why = e.to_string();
        let first = why.lines().next().unwrap_or_default().trim_start_matches("error: ").to_string();
        anyhow!("--against {spec:?}: {first}")
    })?;
    if parsed.run.model.is_some() {
        bail!("--against {spec:?}: a setting runs the exact run's model; give -m once, outside --against");
    }
    Ok(Setting { name, flags: parsed.run.over(base) })
}

/// Runs `bmoe eval`.
pub fn eval(args: EvalArgs) -> Result<()> {
    if args.tokens < 2 {
        bail!("--tokens {}: at least 2 (the first token has no prediction to score)", args.tokens);
    }
    let settings: Vec<Setting> = args.against.iter().map(|s| parse_setting(s, &args.run)).collect::<Result<_>>()?;
    let text = eval::text::load(args.text.as_deref()).map_err(|e| anyhow!("--text {e}"))?;
    // A CSV file that cannot be written is said before the runs.
    let mut csv = match &args.csv {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| anyhow!("--csv {}: {e}", path.display()))?,
        )),
        None => None,
    };

    if args.branches {
        print_branches(&args.run, &text, args.tokens)?;
        if settings.is_empty() {
            return Ok(());
        }
        println!();
    }
    let results =
        measure(&args.run, &settings, &text, args.tokens, args.text.as_ref().map(|p| p.display().to_string()))?;
    print_table(&results)?;
    if let (Some(out), Some(path)) = (csv.as_mut(), &args.csv) {
        write_csv(out, &results).map_err(|e| anyhow!("--csv {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Runs the exact run (`base`) and then each setting over the first
/// `positions` tokens of `text` (`source` names it; `None`: the bundled
/// sample), one model open at a time; the exact run comes first.
pub(super) fn measure(
    base: &RunFlags,
    settings: &[Setting],
    text: &str,
    positions: usize,
    source: Option<String>,
) -> Result<Vec<Measured>> {
    let mut host = open_host(resolve_config(base, &TurnFlags::default())?, false)?;
    let session = host.session_mut();
    let mut tokens = session.model().tokenize(text, true);
    tokens.truncate(positions.saturating_add(1).min(session.n_ctx() as usize));
    if tokens.len() < 2 {
        bail!("the text is a single token: nothing to score");
    }
    let scored = tokens.len() - 1;
    let source = source.unwrap_or_else(|| "the bundled sample text".to_string());
    eprintln!(
        "eval: {scored} positions of {source}, teacher-forced; {} setting(s) against the exact run",
        settings.len()
    );

    let mut reference: Vec<Reference> = Vec::with_capacity(scored);
    let exact = score(&mut host, &tokens, "exact run", &mut |_, logits| reference.push(Reference::new(logits)))?;
    drop(host);
    let mut results = vec![Measured {
        name: "exact".into(),
        positions: vec![Position { kl: 0.0, same_top1: true }; reference.len()],
        summary: exact,
    }];
    for setting in settings {
        let mut host = open_host(resolve_config(&setting.flags, &TurnFlags::default())?, false)?;
        let mut positions = Vec::with_capacity(scored);
        let summary = score(&mut host, &tokens, &setting.name, &mut |i, logits| {
            positions.push(eval::compare(&reference[i], logits))
        })?;
        results.push(Measured { name: setting.name.clone(), positions, summary });
    }
    Ok(results)
}

/// Measures and prints each MoE layer's branch and residual sizes over the
/// first `positions` tokens of `text` on `base`'s model, run resident.
fn print_branches(base: &RunFlags, text: &str, positions: usize) -> Result<()> {
    let config = resolve_config(base, &TurnFlags::default())?;
    // 0 means tuned while decoding; this measurement runs at one per core.
    let threads = match config.generate.threads {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get() as u32),
        n => n,
    };
    let path = super::resolve_model(&config)?;
    let measured =
        eval::branches::measure(&path, text, positions, threads).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    eprintln!("eval: MoE branch against the residual stream over {} tokens, resident", measured.tokens);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{:>5}  {:>12}  {:>12}  {:>7}", "layer", "MoE out RMS", "residual RMS", "ratio")?;
    let mut ratios = Vec::new();
    for (l, layer) in measured.layers.iter().enumerate() {
        let Some(b) = layer else { continue };
        ratios.push(b.ratio);
        writeln!(out, "{l:>5}  {:>12.4}  {:>12.4}  {:>7.3}", b.moe_rms, b.residual_rms, b.ratio)?;
    }
    if ratios.is_empty() {
        bail!(
            "{}: no layer showed an ffn_moe_out node (an architecture whose graph names it otherwise)",
            path.display()
        );
    }
    writeln!(out, "{:>5}  {:>12}  {:>12}  {:>7.3}", "mean", "", "", ratios.iter().sum::<f64>() / ratios.len() as f64)?;
    Ok(())
}

/// Scores `tokens` on `host`'s session with a progress bar, handing each
/// position's logits to `on_logits`; Ctrl-C stops the whole evaluation.
fn score(
    host: &mut crate::host::Host,
    tokens: &[i32],
    what: &str,
    on_logits: &mut dyn FnMut(usize, &[f32]),
) -> Result<RunSummary> {
    let _forward = Forward::to(host.abort_handle().flag())?;
    let bar = crate::progress::count_bar((tokens.len() - 1) as u64, what);
    let scored = host.session_mut().score(tokens, &mut |i, logits| {
        on_logits(i, logits);
        bar.inc(1);
        ControlFlow::Continue(())
    });
    bar.finish_and_clear();
    let scored = scored.map_err(|e| anyhow!("{what}: {e}"))?;
    interrupt::check()?;
    if scored.stopped {
        bail!("{what}: stopped before the end of the text");
    }
    Ok(scored.summary)
}

/// The table on stdout: a row per run, the exact one first.
pub(super) fn print_table(results: &[Measured]) -> Result<()> {
    let width = results.iter().map(|r| r.name.len()).max().unwrap_or(5).max(7);
    // Reads a drop policy avoided, where one ran.
    let avoided = results.iter().any(|r| r.summary.avoided_bytes > 0);
    let mut out = std::io::stdout().lock();
    write!(
        out,
        "{:width$}  {:>9}  {:>9}  {:>9}  {:>9}  {:>7}  {:>8}  {:>7}",
        "setting", "mean KL", "median", "p99", "max", "top-1", "MiB/tok", "tok/s"
    )?;
    writeln!(out, "{}", if avoided { "  avoided MiB/tok" } else { "" })?;
    for r in results {
        let Some(s) = KlStats::of(&r.positions) else { continue };
        let num = |v: Option<f64>, digits: usize| v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"));
        write!(
            out,
            "{:width$}  {:>9}  {:>9}  {:>9}  {:>9}  {:>6.1}%  {:>8}  {:>7}",
            r.name,
            kl_text(s.mean),
            kl_text(s.median),
            kl_text(s.p99),
            kl_text(s.max),
            100.0 * s.top1_agreement,
            num(r.summary.mib_per_token(), 2),
            num(r.summary.decode_tps(), 1)
        )?;
        if avoided {
            let per_token = r.summary.avoided_bytes as f64 / 1048576.0 / r.summary.decode_tokens.max(1) as f64;
            write!(out, "  {per_token:>16.2}")?;
        }
        writeln!(out)?;
    }
    writeln!(out, "KL in nats per position (exact run ‖ setting); top-1: both put the same token first")?;
    Ok(())
}

/// One line per setting and position: `setting,position,kl,same_top1`.
fn write_csv(out: &mut impl Write, results: &[Measured]) -> std::io::Result<()> {
    writeln!(out, "setting,position,kl,same_top1")?;
    for r in results {
        for (i, p) in r.positions.iter().enumerate() {
            writeln!(out, "{},{i},{:.9},{}", r.name.replace(',', ";"), p.kl, u8::from(p.same_top1))?;
        }
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_is_parsed_on_top_of_the_exact_runs_flags() {
        use crate::config::StreamMode;
        let base = RunFlags { moe_stream: Some(StreamMode::On), n_expert_used: None, ..RunFlags::default() };
        let s = parse_setting("top2=--n-expert-used 2", &base).unwrap();
        assert_eq!(s.name, "top2");
        assert_eq!(s.flags.n_expert_used, Some(2));
        assert_eq!(s.flags.moe_stream, Some(StreamMode::On), "the exact run's flags carry over");
        // A list given in the setting replaces the exact run's; other lists stay.
        let base = RunFlags { draft_params: vec!["N=3".into()], drop_params: vec!["T=1".into()], ..base };
        let s = parse_setting("--drop-param T=2 --no-predict", &base).unwrap();
        assert_eq!((s.flags.draft_params, s.flags.drop_params), (vec!["N=3".to_string()], vec!["T=2".to_string()]));
        assert!(s.flags.no_predict && s.flags.moe_stream == Some(StreamMode::On));
        // Unnamed: the flags are the name.
        let s = parse_setting("--n-expert-used 4", &base).unwrap();
        assert_eq!(s.name, "--n-expert-used 4");
        let e = parse_setting("--no-such-flag", &base).unwrap_err().to_string();
        assert!(e.contains("--no-such-flag"), "{e}");
        assert!(parse_setting("x=", &base).unwrap_err().to_string().contains("no flags"));
        let e = parse_setting("-m other.gguf --n-expert-used 2", &base).unwrap_err().to_string();
        assert!(e.contains("exact run's model"), "{e}");
    }
}
