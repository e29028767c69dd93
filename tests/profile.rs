//! Route profiles: a learned profile changes only what is cached (the runs
//! with it, evicting, warm-started, with and without read-ahead, and with
//! the cache off, stay bitwise equal to resident); a run writes its
//! model's profile when it closes; a profile of another model or a corrupt
//! file is ignored with one notice and reads exactly what no profile reads.

mod common;

use std::path::{Path, PathBuf};

use bmoe::engine::{RouteProfileOpen, Session, StreamOptions};
use bmoe::gguf::ModelFiles;
use bmoe::moe::predict::ReadAhead;
use bmoe::moe::profile::{ProfileMode, RouteProfile, model_identity, profile_path};
use bmoe::synth::Arch;
use common::*;

const N: u32 = 32;
/// Between one token's working set and the tiny model's bank: it evicts.
const BUDGET: u64 = 600 << 10;

fn with_profile(
    stream: Option<StreamOptions>,
    dir: &Path,
    mode: ProfileMode,
    read_ahead: ReadAhead,
) -> Option<StreamOptions> {
    stream.map(|s| StreamOptions { route_profile: RouteProfileOpen { dir: dir.into(), mode }, read_ahead, ..s })
}

/// One generation on its own session: the generation, the bytes its steps
/// read, the open's notices, the warm start's bytes and the prior's evictions.
fn open_and_run(model: &Path, stream: Option<StreamOptions>) -> (bmoe::engine::Generation, u64, Vec<String>, u64, u64) {
    let _serial = llama_lock();
    let mut session = Session::open(options(model, stream)).unwrap_or_else(|e| panic!("open: {e}"));
    let notices = session.info().notices.clone();
    let warm = session.info().warm_bytes;
    let (generation, reports) = generate_steps(&mut session, N);
    let read = reports.iter().map(|r| r.trace.bytes_read).sum();
    let prior = session.store().map_or(0, |s| s.prior_evictions());
    (generation, read, notices, warm, prior)
}

fn profile_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default()
}

#[test]
fn runs_with_a_learned_profile_stay_bitwise_equal_to_resident() {
    let dir = tempdir();
    let profiles = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (reference, _) = run(options(&m, None), N);
    // Learning: the run adds its routing; the file is written when the session closes.
    let learn = with_profile(cached(BUDGET, 3), profiles.path(), ProfileMode::Update, ReadAhead::default());
    for _ in 0..2 {
        let (learning, _, _, _, _) = open_and_run(&m, learn.clone());
        assert_identical(&reference, &learning, "learning a route profile");
    }
    let files = profile_files(profiles.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let learned = RouteProfile::load(&files[0]).unwrap();
    assert!(learned.tokens() > N as f64, "two runs' routing: {} tokens", learned.tokens());
    let ahead = ReadAhead { layers: 1, router: 1, prefill: true };
    for (what, stream, evicts) in [
        (
            "evicting, warm start",
            with_profile(cached(BUDGET, 3), profiles.path(), ProfileMode::Read, ReadAhead::default()),
            true,
        ),
        (
            "evicting, warm start, read-ahead",
            with_profile(cached(BUDGET, 3), profiles.path(), ProfileMode::Read, ahead),
            true,
        ),
        ("cache off", with_profile(stream0(3, true), profiles.path(), ProfileMode::Read, ReadAhead::default()), false),
    ] {
        let (streamed, read, notices, warm, prior) = open_and_run(&m, stream);
        assert_identical(&reference, &streamed, what);
        assert!(read > 0, "{what}: nothing streamed");
        assert!(notices.iter().all(|n| !n.contains("route profile")), "{what}: {notices:?}");
        if evicts {
            // The profile did act: the cache started warm and the prior chose victims.
            assert!(warm > 0, "{what}: no warm start");
            assert!(prior > 0, "{what}: the prior chose no victim");
        } else {
            assert_eq!((warm, prior), (0, 0), "{what}: the cache is off");
        }
    }
    // `read` leaves the file as it was.
    assert_eq!(RouteProfile::load(&files[0]).unwrap(), learned);
}

#[test]
fn a_corrupt_profile_or_another_models_is_ignored_with_one_notice_and_reads_as_much_as_none() {
    let dir = tempdir();
    let profiles = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let other = write_tiny(dir.path(), "other.gguf", Arch::Qwen3Moe, |s| s.seed += 1);
    let identity = model_identity(&ModelFiles::open(&m).unwrap()).unwrap();
    let other_identity = model_identity(&ModelFiles::open(&other).unwrap()).unwrap();
    assert_ne!(identity, other_identity, "another seed is another model");
    let path = profile_path(profiles.path(), &identity);
    let read_mode = || with_profile(cached(BUDGET, 2), profiles.path(), ProfileMode::Read, ReadAhead::default());
    let (reference, none_read, _, _, _) =
        open_and_run(&m, with_profile(cached(BUDGET, 2), profiles.path(), ProfileMode::Off, ReadAhead::default()));

    // Another model's profile (learned for real) under this model's name.
    let learn_other = with_profile(cached(BUDGET, 2), profiles.path(), ProfileMode::Update, ReadAhead::default());
    open_and_run(&other, learn_other);
    let other_path = profile_path(profiles.path(), &other_identity);
    assert!(RouteProfile::load(&other_path).is_ok_and(|p| !p.is_empty()));
    std::fs::copy(&other_path, &path).unwrap();
    // A corrupt file: cut short, then garbage.
    let whole = std::fs::read(&other_path).unwrap();
    for (what, bytes) in [
        ("another model's", None),
        ("cut short", Some(whole[..whole.len() / 2].to_vec())),
        ("garbage", Some(b"\x00\xffnot json".to_vec())),
    ] {
        if let Some(bytes) = bytes {
            std::fs::write(&path, bytes).unwrap();
        }
        let (streamed, read, notices, warm, prior) = open_and_run(&m, read_mode());
        let said: Vec<&String> = notices.iter().filter(|n| n.contains("route profile")).collect();
        assert_eq!(said.len(), 1, "{what}: one notice, got {notices:?}");
        assert!(said[0].contains("ignored"), "{what}: {said:?}");
        assert_identical(&reference, &streamed, what);
        assert_eq!((warm, prior), (0, 0), "{what}: an ignored profile warms nothing and chooses no victim");
        assert_eq!(read, none_read, "{what}: reads differ from a run without a profile");
    }
    // `update` replaces a corrupt file with this model's own profile.
    open_and_run(&m, with_profile(cached(BUDGET, 2), profiles.path(), ProfileMode::Update, ReadAhead::default()));
    let replaced = RouteProfile::load(&path).unwrap();
    assert!(replaced.fits(&identity, replaced.n_layer, replaced.n_expert) && !replaced.is_empty());
}

/// A long session (chat, serve) saves its profile as it runs, not only when
/// it closes: with the interval shortened, the next generation writes what
/// the ones before it routed while the session stays open.
#[test]
fn a_running_session_saves_its_profile_between_generations() {
    let dir = tempdir();
    let profiles = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let stream = with_profile(cached(BUDGET, 2), profiles.path(), ProfileMode::Update, ReadAhead::default());
    let _serial = llama_lock();
    let mut session = Session::open(options(&m, stream)).unwrap();
    session.set_profile_save_every(std::time::Duration::ZERO);
    generate_steps(&mut session, N);
    assert!(profile_files(profiles.path()).is_empty(), "nothing is saved before the first generation ends");
    generate_steps(&mut session, N);
    let files = profile_files(profiles.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let saved = RouteProfile::load(&files[0]).unwrap();
    assert!(saved.tokens() >= N as f64, "the first generation's routing: {} tokens", saved.tokens());
    assert!(saved.model_path.ends_with("m.gguf"), "{}", saved.model_path);
    drop(session);
    assert!(RouteProfile::load(&files[0]).unwrap().tokens() > saved.tokens(), "closing adds the second generation");
}
