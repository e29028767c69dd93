//! MTP self-speculation on the real engine: drafts from the model's own
//! next-token-prediction layer, verified in one batch, give exactly greedy
//! decoding's tokens, resident and streamed, cache off and evicting, over
//! several turns; a model without MTP layers, sampling and grammars are
//! refused with clear errors.

mod common;

use bmoe::engine::{Event, GenerateRequest, Session, SessionOptions};
use bmoe::llama::{Constraint, MtpExperts, MtpParams, Sampling};
use bmoe::synth::Arch;
use common::*;

const TURNS: [&str; 3] = [PROMPT, " and then", " finally, the end."];

/// MTP drafting of up to 3 tokens; a floor of 0 drafts whatever the head says.
fn with_mtp(opts: SessionOptions, p_min: f32) -> SessionOptions {
    with_mtp_experts(opts, p_min, MtpExperts::default())
}

/// MTP drafting as [`with_mtp`], the MTP layer computing with `experts`.
fn with_mtp_experts(opts: SessionOptions, p_min: f32, experts: MtpExperts) -> SessionOptions {
    // `batch_invariant = auto` gives a run that verifies drafts the batch-invariant kernels.
    SessionOptions { mtp: Some(MtpParams { draft_max: 3, p_min, experts }), batch_invariant: true, ..opts }
}

#[test]
fn mtp_drafting_reproduces_greedy_decoding() {
    // A random head (every draft forced out with a floor of 0, nearly all
    // rejected) and an agreeing one (most accepted): both roll back cleanly.
    let dir = tempdir();
    for arch in [Arch::Glm4Moe, Arch::Deepseek2] {
        let random = write_tiny(dir.path(), &format!("{arch:?}.gguf"), arch, |s| assert_eq!(s.mtp_layers, 1));
        let agreeing = write_tiny(dir.path(), &format!("{arch:?}-agree.gguf"), arch, |_| {});
        let head = {
            let _serial = llama_lock();
            bmoe::mtp_head::write_agreeing_head(&agreeing, 0.7, 7, 1).unwrap()
        };
        assert!(head.agreeing > 0 && head.agreeing < head.with_successor, "{head:?}");
        for (m, p_min) in [(&random, 0.0), (&agreeing, 0.5)] {
            let (reference, _) = run_turns(options(m, None), &TURNS, 24);
            let configs = [None, stream0(2, true), cached(100 * 1024, 2)]
                .into_iter()
                .flat_map(|s| MtpExperts::ALL.map(|e| (s.clone(), e)))
                .filter(|(s, e)| s.is_some() || *e == MtpExperts::default());
            for (stream, experts) in configs {
                let what = format!("{} with {stream:?}, {} experts", m.display(), experts.name());
                let streamed = stream.is_some();
                let (got, reports) = run_turns(with_mtp_experts(options(m, stream), p_min, experts), &TURNS, 24);
                for (i, (r, g)) in reference.iter().zip(&got).enumerate() {
                    assert_eq!(r.tokens, g.tokens, "{what}, turn {i}");
                    assert!(g.summary.speculative, "{what}");
                }
                let drafted: u32 = reports.iter().map(|r| r.drafted).sum();
                let accepted: u32 = reports.iter().map(|r| r.accepted).sum();
                assert!(drafted > 0, "{what}: nothing drafted");
                // Streamed, the MTP layer (after the 4 trunk layers) routes and
                // reads its experts through the same cache in every step that drafted.
                let mtp_rows = |r: &bmoe::engine::StepReport| r.trace.rows.iter().filter(|row| row.layer == 4).count();
                let decode = || reports.iter().filter(|r| r.phase == bmoe::engine::Phase::Decode);
                if streamed {
                    let drafting = decode().filter(|r| r.drafted > 0);
                    assert!(
                        drafting.clone().all(|r| mtp_rows(r) > 0),
                        "{what}: a draft without the MTP layer's routing"
                    );
                    assert!(decode().map(|r| r.trace.bytes_read).sum::<u64>() > 0, "{what}");
                    // Drafting with the cached experts skips the others in the
                    // MTP layer (and never in the trunk); drafting with all skips none.
                    let rows = || reports.iter().flat_map(|r| &r.trace.rows);
                    let skipped = rows().filter(|row| row.dropped && row.layer == 4).count();
                    assert!(rows().all(|row| !row.dropped || row.layer == 4), "{what}");
                    assert_eq!(skipped > 0, experts == MtpExperts::Cached, "{what}: {skipped} skipped");
                } else {
                    assert!(reports.iter().all(|r| mtp_rows(r) == 0), "{what}");
                }
                if m == &random {
                    // A head that keeps missing rests: steps go by without a draft.
                    assert!(decode().any(|r| r.drafted == 0), "{what}: the useless head never rested");
                }
                if m == &agreeing {
                    assert!(accepted * 3 > drafted, "{what}: {accepted} of {drafted} accepted");
                    // Accepted drafts save verify steps.
                    let steps = reports.iter().filter(|r| r.phase == bmoe::engine::Phase::Decode).count();
                    assert!(steps < 3 * 23, "{what}: {steps} decode steps");
                }
            }
        }
    }
}

#[test]
fn mtp_is_refused_where_it_cannot_work() {
    let dir = tempdir();
    let plain = write_tiny(dir.path(), "q.gguf", Arch::Qwen3Moe, |_| {});
    let _serial = llama_lock();
    let e = Session::open(with_mtp(options(&plain, None), 0.5)).err().expect("no MTP layers");
    assert!(e.to_string().contains("has no MTP layers"), "{e}");
    let m = write_tiny(dir.path(), "g.gguf", Arch::Glm4Moe, |_| {});
    let mut s = Session::open(with_mtp(options(&m, None), 0.5)).unwrap();
    assert!(s.drafts_with_mtp());
    let request = |sampling: Sampling, constraint: Option<Constraint>| GenerateRequest {
        prompt: PROMPT.into(),
        n_predict: 4,
        sampling,
        continue_context: false,
        keep_logits: false,
        constraint,
    };
    let hot = Sampling { temp: 0.8, ..Sampling::default() };
    let e = s.generate(&request(hot, None), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("use --temp 0 with --mtp"), "{e}");
    let e = s
        .generate(&request(Sampling::default(), Some(Constraint::Grammar("root ::= \"a\"".into()))), &mut |_| {})
        .unwrap_err();
    assert!(e.to_string().contains("a grammar and MTP drafting do not go together"), "{e}");
    // Still usable after the refusals.
    let mut steps = 0;
    let g = s.generate(&request(Sampling::default(), None), &mut |e| steps += u32::from(matches!(e, Event::Step(_))));
    assert_eq!(g.unwrap().tokens.len(), 4);
    assert!(steps > 0);
}

#[test]
fn mtp_runs_beside_a_drop_plugin_from_the_command_line() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "g.gguf", Arch::Glm4Moe, |_| {});
    let _serial = llama_lock();
    bmoe::mtp_head::write_agreeing_head(&m, 0.7, 7, 1).unwrap();
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_bmoe"))
            .args(["generate", "-m", m.to_str().unwrap(), "-p", PROMPT, "-n", "32", "-t", "1", "--moe-stream"])
            .args(extra)
            .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
    };
    // A keep-all threshold drops nothing: the text is the plain run's.
    let (plain, _) = run(&["--drop-plugin", "drop-cold", "--drop-param", "F=0"]);
    let (drafted, err) = run(&["--mtp", "--drop-plugin", "drop-cold", "--drop-param", "F=0"]);
    assert_eq!(plain, drafted);
    let line = err.lines().find(|l| l.starts_with("draft:")).unwrap_or_else(|| panic!("{err}"));
    assert!(!line.starts_with("draft:   0 drafted"), "{line}");
    assert!(err.lines().any(|l| l.starts_with("drop:")), "{err}");
}
