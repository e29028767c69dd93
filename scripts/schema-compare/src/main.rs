//! bmoe's JSON Schema converter (src/schema, compiled here from bmoe's own
//! source) under llama.cpp's grammar sampler, against llguidance, on
//! Qwen3's 151,936-token vocabulary:
//!
//! - coverage: per JSON Schema feature, whether each side takes the schema,
//!   lets every valid text through and stops every invalid one;
//! - cost: the time per decoded token to mask the vocabulary and advance,
//!   both engines fed the same tokens in one process, repeated, medians.
//!
//! `scripts/schema-compare.sh` builds and runs it.

#[allow(dead_code, clippy::all)]
#[path = "../../../src/schema/mod.rs"]
mod schema;

mod cases;
mod llama;
mod llg;
mod vocab;

use std::path::PathBuf;
use std::time::Instant;

use serde_json::Value;

struct Args {
    /// Qwen's BPE ranks (Qwen3's vocabulary is built from them).
    tiktoken: Option<PathBuf>,
    /// Or any model file: its own vocabulary, as llama.cpp reads it.
    gguf: Option<PathBuf>,
    reps: usize,
    work: PathBuf,
    coverage: bool,
    cost: bool,
    /// Extra cost cases: a schema file and a file with an answer to it.
    extra: Vec<(PathBuf, PathBuf)>,
    /// Only the extra cost cases.
    extra_only: bool,
}

const USAGE: &str = "usage: schema-compare (--tiktoken qwen.tiktoken | --gguf MODEL.gguf) [--reps N] [--work DIR] \
                     [--coverage-only | --cost-only] [--cost-case SCHEMA.json ANSWER.txt]... [--extra-only]";

fn args() -> Args {
    let mut a = Args {
        tiktoken: None,
        gguf: None,
        reps: 7,
        work: std::env::temp_dir().join("schema-compare"),
        coverage: true,
        cost: true,
        extra: Vec::new(),
        extra_only: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| fail(&format!("{arg} needs a value\n{USAGE}")));
        match arg.as_str() {
            "--tiktoken" => a.tiktoken = Some(value().into()),
            "--gguf" => a.gguf = Some(value().into()),
            "--reps" => a.reps = value().parse().unwrap_or_else(|_| fail(USAGE)),
            "--work" => a.work = value().into(),
            "--cost-case" => {
                let schema = value();
                let answer = value();
                a.extra.push((schema.into(), answer.into()));
            }
            "--extra-only" => a.extra_only = true,
            "--coverage-only" => a.cost = false,
            "--cost-only" => a.coverage = false,
            _ => fail(USAGE),
        }
    }
    if a.tiktoken.is_some() == a.gguf.is_some() || a.reps == 0 {
        fail(USAGE);
    }
    a
}

/// Resident set size in MiB.
fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0.0);
    pages * 4096.0 / (1024.0 * 1024.0)
}

fn main() {
    let a = args();
    std::fs::create_dir_all(&a.work).expect("work dir");
    let (gguf, qwen) = match (&a.tiktoken, &a.gguf) {
        (Some(tiktoken), _) => {
            let v = vocab::Vocab::load(tiktoken).unwrap_or_else(|e| fail(&e));
            let gguf = a.work.join("qwen3-vocab.gguf");
            v.write_gguf(&gguf).expect("write the vocabulary GGUF");
            (gguf, Some(v))
        }
        (_, Some(g)) => (g.clone(), None),
        _ => unreachable!(),
    };

    let t = Instant::now();
    let lv = llama::Vocab::load(&gguf).unwrap_or_else(|e| fail(&e));
    let llama_load = t.elapsed().as_secs_f64();
    let eos = if qwen.is_some() { vocab::EOS } else { lv.eos() };
    // llguidance's token table: from the Qwen ranks, or from the pieces
    // llama.cpp reads in the model file (control tokens marked special).
    let words = match &qwen {
        Some(v) => v.llg_words(),
        None => (0..lv.n_tokens as u32)
            .map(|t| {
                let piece = lv.piece(t);
                if lv.is_control(t) && !piece.is_empty() { [&[0xFF][..], &piece].concat() } else { piece }
            })
            .collect(),
    };
    let rss = rss_mib();
    let t = Instant::now();
    let engine = llg::Engine::new(&words, eos).unwrap_or_else(|e| fail(&e));
    let llg_load = t.elapsed().as_secs_f64();
    let llg_mib = rss_mib() - rss;
    drop(words);

    // Both engines must read every text token as the same bytes.
    let mut differ = 0;
    for t in 0..lv.n_tokens as u32 {
        if !lv.is_control(t) && lv.piece(t) != engine.trie().token(t) {
            differ += 1;
        }
    }
    println!(
        "vocabulary: {} ({} tokens), text tokens the two engines read differently: {differ}; \
         end token {eos} (end of generation for llama.cpp: {})",
        if qwen.is_some() { "Qwen3's, from its BPE ranks".to_string() } else { gguf.display().to_string() },
        lv.n_tokens,
        lv.is_eog(eos)
    );
    println!(
        "one-off setup per process: llama.cpp vocabulary load {:.0} ms (bmoe pays it with the model); \
         llguidance token trie + parser factory {:.0} ms, {:.0} MiB resident",
        llama_load * 1e3,
        llg_load * 1e3,
        llg_mib
    );
    if differ != 0 || (qwen.is_some() && lv.n_tokens != vocab::SIZE) || !lv.is_eog(eos) {
        fail("the two engines do not see the same vocabulary");
    }

    if a.coverage {
        coverage(&lv, &engine, eos);
        if qwen.is_some() {
            special_tokens_in_strings(&lv, &engine);
        }
    }
    if a.cost {
        let mut cases = if a.extra_only { Vec::new() } else { cases::cost_cases() };
        for (schema, answer) in &a.extra {
            let read =
                |p: &PathBuf| std::fs::read_to_string(p).unwrap_or_else(|e| fail(&format!("{}: {e}", p.display())));
            let name = schema.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            cases.push(cases::CostCase { name, schema: read(schema), answer: read(answer).trim_end().to_string() });
        }
        cost(&lv, &engine, eos, a.reps, &cases);
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("schema-compare: {msg}");
    std::process::exit(1);
}

/// Tokens of `text`: greedy longest match over the vocabulary, the same ids
/// for both engines.
fn tokens(engine: &llg::Engine, text: &str) -> Vec<u32> {
    let toks = engine.trie().greedy_tokenize(text.as_bytes());
    assert_eq!(engine.trie().decode(&toks), text.as_bytes(), "{text} does not tokenize back");
    toks
}

/// One side's verdict on a case.
enum Verdict {
    Refused(String),
    Ran { valid: (usize, usize), invalid: (usize, usize), warnings: Vec<String> },
}

impl Verdict {
    fn cell(&self) -> String {
        match self {
            Verdict::Refused(_) => "refused".into(),
            Verdict::Ran { valid, invalid, warnings } => {
                let exact = valid.0 == valid.1 && invalid.0 == invalid.1;
                let w = if warnings.is_empty() { "" } else { " (warns)" };
                if exact {
                    format!("yes{w}")
                } else {
                    let mut parts = Vec::new();
                    if valid.0 != valid.1 {
                        parts.push(format!("valid {}/{}", valid.0, valid.1));
                    }
                    if invalid.0 != invalid.1 {
                        parts.push(format!("stops invalid {}/{}", invalid.0, invalid.1));
                    }
                    format!("partial: {}{w}", parts.join(", "))
                }
            }
        }
    }

    fn exact(&self) -> bool {
        matches!(self, Verdict::Ran { valid, invalid, .. } if valid.0 == valid.1 && invalid.0 == invalid.1)
    }
}

fn coverage(lv: &llama::Vocab, engine: &llg::Engine, eos: u32) {
    println!("\n## Coverage: {} JSON Schema features", cases::COVERAGE.len());
    println!("(yes: takes the schema, every valid text passes and every invalid one is stopped;");
    println!(" partial: takes it, and lets a valid text through / stops an invalid one less than the spec says)\n");
    let width = cases::COVERAGE.iter().map(|c| c.feature.chars().count()).max().unwrap_or(10);
    println!("| {:width$} | {:38} | {:38} |", "feature", "bmoe converter + llama.cpp", "llguidance");
    println!("|{}|{}|{}|", "-".repeat(width + 2), "-".repeat(40), "-".repeat(40));
    let mut notes = Vec::new();
    let (mut bmoe_yes, mut llg_yes, mut bmoe_taken, mut llg_taken) = (0, 0, 0, 0);
    for c in cases::COVERAGE {
        let schema: Value = serde_json::from_str(c.schema).unwrap_or_else(|e| panic!("{}: {e}", c.feature));
        let bmoe = match schema::to_grammar(c.schema) {
            Err(e) => Verdict::Refused(format!("to_grammar: {e}")),
            Ok(gbnf) => match llama::Grammar::new(lv, &gbnf) {
                Err(e) => Verdict::Refused(e),
                Ok(mut g) => {
                    let pass = |text: &str, g: &mut llama::Grammar| g.run(&tokens(engine, text), eos).accepted;
                    let valid = c.valid.iter().filter(|t| pass(t, &mut g)).count();
                    let invalid = c.invalid.iter().filter(|t| !pass(t, &mut g)).count();
                    Verdict::Ran {
                        valid: (valid, c.valid.len()),
                        invalid: (invalid, c.invalid.len()),
                        warnings: Vec::new(),
                    }
                }
            },
        };
        let llg = match engine.compile(&schema) {
            Err(e) => Verdict::Refused(e),
            Ok((mut m, warnings)) => {
                let mut logits = vec![0f32; lv.n_tokens];
                let mut pass = |text: &str| engine.run(&mut m, &tokens(engine, text), eos, &mut logits).accepted;
                let valid = c.valid.iter().filter(|t| pass(t)).count();
                let invalid = c.invalid.iter().filter(|t| !pass(t)).count();
                Verdict::Ran { valid: (valid, c.valid.len()), invalid: (invalid, c.invalid.len()), warnings }
            }
        };
        bmoe_yes += bmoe.exact() as usize;
        llg_yes += llg.exact() as usize;
        bmoe_taken += !matches!(bmoe, Verdict::Refused(_)) as usize;
        llg_taken += !matches!(llg, Verdict::Refused(_)) as usize;
        println!("| {:width$} | {:38} | {:38} |", c.feature, bmoe.cell(), llg.cell());
        for (side, v) in [("bmoe", &bmoe), ("llguidance", &llg)] {
            match v {
                Verdict::Refused(e) => notes.push(format!("{}: {side} refused: {e}", c.feature)),
                Verdict::Ran { warnings, .. } if !warnings.is_empty() => {
                    notes.push(format!("{}: {side} warned: {}", c.feature, warnings.join("; ")))
                }
                _ => {}
            }
        }
    }
    let n = cases::COVERAGE.len();
    println!(
        "\ntaken: bmoe {bmoe_taken}/{n}, llguidance {llg_taken}/{n}; exact (yes): bmoe {bmoe_yes}/{n}, llguidance {llg_yes}/{n}\n"
    );
    for note in notes {
        println!("- {note}");
    }
}

/// Control tokens (`<|im_start|>`...) are no text: a grammar should never
/// let one into a JSON string. Which engine lets them through.
fn special_tokens_in_strings(lv: &llama::Vocab, engine: &llg::Engine) {
    let schema = r#"{"type":"object","properties":{"s":{"type":"string"}},"required":["s"]}"#;
    let prefix = tokens(engine, r#"{"s":"abc"#);
    let specials: Vec<u32> = (vocab::EOS + 1..vocab::EOS + 12).filter(|&t| lv.is_control(t) && !lv.is_eog(t)).collect();
    let gbnf = schema::to_grammar(schema).expect("bmoe takes the schema");
    let mut g = llama::Grammar::new(lv, &gbnf).expect("llama.cpp takes it");
    let in_llama = g.allows_after(&prefix, &specials).iter().filter(|&&a| a).count();
    let (mut m, _) = engine.compile(&serde_json::from_str(schema).unwrap()).expect("llguidance takes it");
    let in_llg = engine.allows_after(&mut m, &prefix, &specials).iter().filter(|&&a| a).count();
    println!(
        "\ncontrol tokens (<|object_ref_start|>...) allowed inside a JSON string, of {}: \
         bmoe + llama.cpp {in_llama}, llguidance {in_llg}",
        specials.len()
    );
}

/// Median of `xs` (sorted in place).
fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    if n % 2 == 1 { xs[n / 2] } else { (xs[n / 2 - 1] + xs[n / 2]) / 2.0 }
}

/// One engine's timings over the runs of one schema.
#[derive(Default)]
struct Timing {
    /// Every step of every run.
    steps: Vec<f64>,
    /// Each run's mean step.
    means: Vec<f64>,
    /// Each run's compile time.
    compile: Vec<f64>,
}

impl Timing {
    fn add(&mut self, compile: f64, run: llama::Run) {
        self.compile.push(compile);
        self.means.push(run.step_s.iter().sum::<f64>() / run.step_s.len() as f64);
        self.steps.extend(run.step_s);
    }

    /// Median step, median of the runs' means, and median compile, in µs.
    fn summary(&mut self) -> (f64, f64, f64) {
        (median(&mut self.steps) * 1e6, median(&mut self.means) * 1e6, median(&mut self.compile) * 1e6)
    }
}

fn cost(lv: &llama::Vocab, engine: &llg::Engine, eos: u32, reps: usize, cases: &[cases::CostCase]) {
    println!("\n## Cost per token on the {}-token vocabulary ({reps} runs each, alternating, one thread)", lv.n_tokens);
    println!("A step masks every token of the vocabulary and accepts the chosen one:");
    println!("- llama.cpp: its grammar stage over the whole candidate array, as bmoe's sampler runs it today;");
    println!("- llama.cpp, chosen only: the grammar asked about the chosen token alone (llama.cpp's common");
    println!("  sampler's first try; when the model's choice is refused it needs the full mask as well);");
    println!("- llguidance: compute_mask + the mask applied to a logits row + consume_token.");
    println!(
        "med: median step; mean: a run's total / its steps (median of the runs); µs. ratio: llama.cpp / llguidance.\n"
    );
    println!(
        "| {:16} | {:>5} | {:>14} | {:>14} | {:>14} | {:>14} | {:>14} | {:>14} | {:>9} | {:>10} |",
        "schema",
        "steps",
        "llama.cpp med",
        "llama.cpp mean",
        "chosen-only med",
        "chosen-only mean",
        "llguidance med",
        "llguidance mean",
        "ratio med",
        "ratio mean"
    );
    println!("|{}|", ["---"; 10].join("|"));
    let mut compile_rows = Vec::new();
    let mut logits = vec![0f32; lv.n_tokens];
    for c in cases {
        let schema: Value = serde_json::from_str(&c.schema).unwrap_or_else(|e| fail(&format!("{}: {e}", c.name)));
        let toks = tokens(engine, &c.answer);
        let gbnf = schema::to_grammar(&c.schema).unwrap_or_else(|e| fail(&format!("{}: bmoe refused: {e}", c.name)));
        // Warm-up, and both must take the answer.
        let mut g = llama::Grammar::new(lv, &gbnf).unwrap_or_else(|e| fail(&format!("{}: {e}", c.name)));
        let r = g.run(&toks, eos);
        if !r.accepted {
            fail(&format!("{}: llama.cpp refused the answer at step {:?}", c.name, r.refused_at));
        }
        let (mut m, _) = engine.compile(&schema).unwrap_or_else(|e| fail(&format!("{}: llguidance: {e}", c.name)));
        let r = engine.run(&mut m, &toks, eos, &mut logits);
        if !r.accepted {
            fail(&format!("{}: llguidance refused the answer at step {:?}", c.name, r.refused_at));
        }
        let (mut full, mut chosen, mut llg) = (Timing::default(), Timing::default(), Timing::default());
        for rep in 0..reps {
            // Each run compiles anew, as a request with a schema does.
            let run_llama = |full: &mut Timing, chosen: &mut Timing| {
                let t = Instant::now();
                let gbnf = schema::to_grammar(&c.schema).unwrap();
                let mut g = llama::Grammar::new(lv, &gbnf).unwrap();
                let compile = t.elapsed().as_secs_f64();
                full.add(compile, g.run(&toks, eos));
                chosen.add(compile, g.run_chosen_only(&toks, eos));
            };
            let mut run_llg = |llg: &mut Timing| {
                let t = Instant::now();
                let (mut m, _) = engine.compile(&schema).unwrap();
                let compile = t.elapsed().as_secs_f64();
                llg.add(compile, engine.run(&mut m, &toks, eos, &mut logits));
            };
            if rep % 2 == 0 {
                run_llama(&mut full, &mut chosen);
                run_llg(&mut llg);
            } else {
                run_llg(&mut llg);
                run_llama(&mut full, &mut chosen);
            }
        }
        let (fmed, fmean, fcomp) = full.summary();
        let (cmed, cmean, _) = chosen.summary();
        let (gmed, gmean, gcomp) = llg.summary();
        let steps = toks.len() + 1;
        println!(
            "| {:16} | {:>5} | {:>14.0} | {:>14.0} | {:>14.1} | {:>14.1} | {:>14.1} | {:>14.1} | {:>8.0}x | {:>9.0}x |",
            c.name,
            steps,
            fmed,
            fmean,
            cmed,
            cmean,
            gmed,
            gmean,
            fmed / gmed,
            fmean / gmean
        );
        compile_rows.push((&c.name, steps, fcomp, gcomp, fmean, gmean));
    }
    println!("\nper request (medians): the schema compiled, and a whole answer's steps");
    println!(
        "| {:16} | {:>5} | {:>26} | {:>16} | {:>17} | {:>17} |",
        "schema", "steps", "bmoe to_grammar + init ms", "llguidance ms", "answer, llama.cpp", "answer, llguidance"
    );
    println!("|{}|", ["---"; 6].join("|"));
    for (name, steps, fcomp, gcomp, fmean, gmean) in compile_rows {
        println!(
            "| {:16} | {:>5} | {:>26.2} | {:>16.2} | {:>14.0} ms | {:>15.1} ms |",
            name,
            steps,
            fcomp / 1e3,
            gcomp / 1e3,
            fmean * steps as f64 / 1e3,
            gmean * steps as f64 / 1e3
        );
    }
}
