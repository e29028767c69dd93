//! `bmoe pull` and `-m hf:` against a stand-in for the Hugging Face Hub on
//! 127.0.0.1 (real HTTP, `HF_ENDPOINT` pointing at it), with real GGUF files
//! made by `make-model`: choosing by tag and by file name, split sets,
//! resuming a cut download to a byte-identical file, a corrupted byte
//! refused, the hub's refusals, offline use, and the cache read by Python's
//! `huggingface_hub` as its own.

mod common;
#[path = "common/hub.rs"]
mod standin;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use standin::{FakeHub, Faults, HubFile, HubRepo, read};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// A stand-in hub with `owner/tiny`: two quantizations of a tiny model (two
/// seeds), a split BF16 set, a projector and a README.
fn hub_with_models(dir: &Path) -> FakeHub {
    let make = |name: &str, extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
            .args(["make-model", "-q", "--preset", "tiny", "-o"])
            .arg(dir.join(name))
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    make("q4.gguf", &[]);
    make("q8.gguf", &["--seed", "7"]);
    make("bf16", &["--seed", "9", "--split", "2"]);
    std::fs::write(dir.join("README.md"), "# tiny\n").unwrap();
    let hub = FakeHub::start();
    hub.add(
        "owner/tiny",
        HubRepo {
            commit: COMMIT.into(),
            files: vec![
                HubFile::from_path("README.md", &dir.join("README.md")),
                HubFile::from_path("Tiny-Q4_K_M.gguf", &dir.join("q4.gguf")),
                HubFile::from_path("Tiny-Q8_0.gguf", &dir.join("q8.gguf")),
                HubFile::from_path("mmproj-Tiny-F16.gguf", &dir.join("README.md")),
                HubFile::from_path("BF16/Tiny-BF16-00001-of-00002.gguf", &dir.join("bf16-00001-of-00002.gguf")),
                HubFile::from_path("BF16/Tiny-BF16-00002-of-00002.gguf", &dir.join("bf16-00002-of-00002.gguf")),
            ],
            gated_token: None,
        },
    );
    hub
}

/// `bmoe ARGS` with the hub at `hub` and its cache under `home`.
fn bmoe(hub: &str, home: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = standin::bmoe_command(hub, home, args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Pulls `spec` and returns the path it printed.
fn pull(hub: &str, home: &Path, spec: &str) -> PathBuf {
    let out = bmoe(hub, home, &["pull", spec], &[]);
    assert!(out.status.success(), "pull {spec}: {}", stderr(&out));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn snapshot(home: &Path, name: &str) -> PathBuf {
    home.join("hub/models--owner--tiny/snapshots").join(COMMIT).join(name)
}

#[test]
fn a_tag_or_a_file_name_picks_the_file_and_a_split_set_comes_whole() {
    let dir = common::tempdir();
    let hub = hub_with_models(dir.path());
    let home = dir.path().join("home");
    // No tag: Q4_K_M, in the hub cache's layout.
    let path = pull(&hub.endpoint, &home, "owner/tiny");
    assert_eq!(path, snapshot(&home, "Tiny-Q4_K_M.gguf"));
    assert_eq!(read(&path), read(&dir.path().join("q4.gguf")));
    let link = std::fs::read_link(&path).unwrap();
    assert!(link.is_relative() && link.starts_with("../../blobs"), "{}", link.display());
    assert_eq!(std::fs::read_to_string(home.join("hub/models--owner--tiny/refs/main")).unwrap(), COMMIT);
    // A tag in any case, a file name, and a split set with both shards.
    assert_eq!(pull(&hub.endpoint, &home, "owner/tiny:q8_0"), snapshot(&home, "Tiny-Q8_0.gguf"));
    assert_eq!(pull(&hub.endpoint, &home, "owner/tiny:Tiny-Q8_0.gguf"), snapshot(&home, "Tiny-Q8_0.gguf"));
    let first = pull(&hub.endpoint, &home, "owner/tiny:BF16");
    assert_eq!(first, snapshot(&home, "BF16/Tiny-BF16-00001-of-00002.gguf"));
    let second = snapshot(&home, "BF16/Tiny-BF16-00002-of-00002.gguf");
    assert_eq!(read(&second), read(&dir.path().join("bf16-00002-of-00002.gguf")));
    // The split set opens from the cache and runs.
    let out = bmoe(&hub.endpoint, &home, &["generate", "-m", "hf:owner/tiny:bf16", "-p", "hi", "-n", "3"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = bmoe(&hub.endpoint, &home, &["generate", "-hf", "owner/tiny", "-p", "hi", "-n", "3"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A second pull downloads nothing.
    let before = hub.log().iter().filter(|(_, p, _)| p.starts_with("/blob/")).count();
    let out = bmoe(&hub.endpoint, &home, &["pull", "owner/tiny:q8_0"], &[]);
    assert!(stderr(&out).contains("already in the cache"), "{}", stderr(&out));
    assert_eq!(hub.log().iter().filter(|(_, p, _)| p.starts_with("/blob/")).count(), before);
    // An unknown tag lists the repository's quantizations.
    let out = bmoe(&hub.endpoint, &home, &["pull", "owner/tiny:IQ2_XS"], &[]);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("no GGUF file is quantized IQ2_XS; it has BF16, Q4_K_M, Q8_0"), "{err}");
}

#[test]
fn a_cut_download_continues_to_an_identical_file_and_a_corrupt_one_is_refused() {
    let dir = common::tempdir();
    let hub = hub_with_models(dir.path());
    let home = dir.path().join("home");
    let original = read(&dir.path().join("q8.gguf"));
    let cut = 1_000_000u64;
    hub.inject(Faults { cut_after: Some(cut), ..Faults::default() });
    let out = bmoe(&hub.endpoint, &home, &["pull", "owner/tiny:Q8_0"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("was cut off at") && err.contains("run the same command to continue"), "{err}");
    assert!(!snapshot(&home, "Tiny-Q8_0.gguf").exists(), "a cut file is not linked");
    let path = pull(&hub.endpoint, &home, "owner/tiny:Q8_0");
    assert_eq!(read(&path), original, "the continued download is byte-identical");
    let ranges: Vec<_> =
        hub.log().into_iter().filter(|(_, p, _)| p.starts_with("/blob/")).filter_map(|(_, _, r)| r).collect();
    assert_eq!(ranges, [format!("bytes={cut}-")], "the second pull asked only for the rest");

    // A flipped byte: refused by the hash, nothing kept or linked; a new
    // pull fetches it whole and right.
    hub.inject(Faults { corrupt_at: Some(12345), ..Faults::default() });
    let out = bmoe(&hub.endpoint, &home, &["pull", "owner/tiny:Q4_K_M"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("its SHA-256 is") && err.contains("corrupt and was removed"), "{err}");
    assert!(!snapshot(&home, "Tiny-Q4_K_M.gguf").exists());
    let blobs: Vec<_> = std::fs::read_dir(home.join("hub/models--owner--tiny/blobs")).unwrap().flatten().collect();
    assert_eq!(blobs.len(), 1, "only the Q8_0 blob: {blobs:?}");
    let path = pull(&hub.endpoint, &home, "owner/tiny:Q4_K_M");
    assert_eq!(read(&path), read(&dir.path().join("q4.gguf")));
}

#[test]
fn refusals_say_what_to_do() {
    let dir = common::tempdir();
    let hub = hub_with_models(dir.path());
    let home = dir.path().join("home");
    let file = HubFile::from_path("Gated-Q4_K_M.gguf", &dir.path().join("q4.gguf"));
    hub.add("owner/gated", HubRepo { commit: COMMIT.into(), files: vec![file], gated_token: Some("secret".into()) });
    let fails = |spec: &str, env: &[(&str, &str)]| {
        let out = bmoe(&hub.endpoint, &home, &["pull", spec], env);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        stderr(&out)
    };
    let err = fails("owner/gated", &[]);
    assert!(err.contains("owner/gated is gated: accept its licence at https://huggingface.co/owner/gated"), "{err}");
    assert!(err.contains("set HF_TOKEN"), "{err}");
    let err = fails("owner/gated", &[("HF_TOKEN", "wrong")]);
    assert!(err.contains("the token in HF_TOKEN has no access"), "{err}");
    let out = bmoe(&hub.endpoint, &home, &["pull", "owner/gated"], &[("HF_TOKEN", "secret")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = fails("owner/missing", &[]);
    assert!(err.contains("owner/missing: no such repository, or a private one"), "{err}");
    let err = fails("owner/missing", &[("HF_TOKEN", "secret")]);
    assert!(err.contains("owner/missing: no such repository (check the name)"), "{err}");
    let err = fails("not-a-repo", &[]);
    assert!(err.contains("write OWNER/NAME[:QUANT]"), "{err}");
}

#[test]
fn offline_the_cache_answers() {
    let dir = common::tempdir();
    let hub = hub_with_models(dir.path());
    let home = dir.path().join("home");
    let offline = [("HF_HUB_OFFLINE", "1")];
    let out = bmoe(&hub.endpoint, &home, &["pull", "owner/tiny"], &offline);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("not in the hub cache") && err.contains("HF_HUB_OFFLINE is set"), "{err}");
    let path = pull(&hub.endpoint, &home, "owner/tiny");
    let asked = hub.log().len();
    let out = bmoe(&hub.endpoint, &home, &["pull", "owner/tiny"], &offline);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()), path);
    assert_eq!(hub.log().len(), asked, "offline asks the hub nothing");
    // A hub that cannot be reached: the cache answers, with a note.
    let out = bmoe("http://127.0.0.1:9", &home, &["pull", "owner/tiny"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("the hub cannot be reached"), "{}", stderr(&out));
    // Not cached and unreachable: an error naming both.
    let out = bmoe("http://127.0.0.1:9", &home, &["pull", "owner/tiny:Q8_0"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("cannot be reached"), "{}", stderr(&out));
}

#[test]
fn huggingface_hub_reads_the_cache_bmoe_writes_and_bmoe_reads_its() {
    if !common::requires::python_venv("huggingface_hub_reads_the_cache_bmoe_writes_and_bmoe_reads_its") {
        return;
    }
    let python = common::serve::client_python();
    let dir = common::tempdir();
    let hub = hub_with_models(dir.path());
    let home = dir.path().join("home");
    let path = pull(&hub.endpoint, &home, "owner/tiny:Q8_0");
    let script = r#"
import sys
from huggingface_hub import try_to_load_from_cache, hf_hub_download
hit = try_to_load_from_cache("owner/tiny", "Tiny-Q8_0.gguf", cache_dir=sys.argv[1])
print(hit)
got = hf_hub_download("owner/tiny", "Tiny-Q4_K_M.gguf", cache_dir=sys.argv[1])
print(got)
"#;
    let out = Command::new(python)
        .args(["-c", script])
        .arg(home.join("hub"))
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env_remove("HF_TOKEN")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", stderr(&out));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(Path::new(lines[0]), path, "huggingface_hub finds bmoe's file in its cache");
    // What huggingface_hub downloaded, bmoe finds offline.
    let out = bmoe(&hub.endpoint, &home, &["pull", "owner/tiny"], &[("HF_HUB_OFFLINE", "1")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let ours = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert_eq!(ours, Path::new(lines[1]));
    assert_eq!(read(&ours), read(&dir.path().join("q4.gguf")));
}

#[test]
fn a_download_that_does_not_fit_does_not_start() {
    let dir = common::tempdir();
    let hub = hub_with_models(dir.path());
    // A 1 MiB file system (tmpfs; needs root, as CI has).
    let small = dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"]).arg(&small).output();
    if !mounted.is_ok_and(|o| o.status.success()) {
        eprintln!("a_download_that_does_not_fit_does_not_start: NOT RUN: mounting a small tmpfs needs root");
        return;
    }
    let out = bmoe(&hub.endpoint, &small, &["pull", "owner/tiny"], &[]);
    let _ = Command::new("umount").arg(&small).status();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("more is needed in") && err.contains("MiB free"), "{err}");
    assert!(err.contains("point HF_HOME (or HF_HUB_CACHE) at a disk with room"), "{err}");
    assert!(!hub.log().iter().any(|(_, p, _)| p.starts_with("/blob/")), "nothing was downloaded");
}

#[test]
fn models_lists_what_is_here_and_rm_frees_it() {
    let dir = common::tempdir();
    let hub = hub_with_models(dir.path());
    let home = dir.path().join("home");
    let empty = bmoe(&hub.endpoint, &home, &["models"], &[]);
    assert!(String::from_utf8_lossy(&empty.stdout).contains("no models yet"), "{}", stderr(&empty));
    pull(&hub.endpoint, &home, "owner/tiny:Q8_0");
    pull(&hub.endpoint, &home, "owner/tiny:BF16");
    let local = dir.path().join("q4.gguf");
    let out = bmoe(&hub.endpoint, &home, &["generate", "-m", local.to_str().unwrap(), "-p", "hi", "-n", "2"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = bmoe(&hub.endpoint, &home, &["models"], &[]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", stderr(&out));
    let row = |name: &str| {
        table.lines().find(|l| l.contains(name)).unwrap_or_else(|| panic!("{name} not in\n{table}")).to_string()
    };
    let q8 = row("owner/tiny:Tiny-Q8_0.gguf [hub]");
    assert!(q8.contains("qwen3moe") && q8.contains(" yes "), "{q8}");
    assert!(row("owner/tiny:BF16/Tiny-BF16-00001-of-00002.gguf (2 shards) [hub]").contains("qwen3moe"));
    let mine = row(&std::fs::canonicalize(&local).unwrap().display().to_string());
    assert!(mine.contains(" now "), "a run just opened it: {mine}");
    // rm: says what it frees; a dry run keeps everything; a file of the
    // user's needs --yes.
    let blob = std::fs::canonicalize(snapshot(&home, "Tiny-Q8_0.gguf")).unwrap();
    let out = bmoe(&hub.endpoint, &home, &["models", "rm", "owner/tiny:Tiny-Q8_0.gguf", "--dry-run"], &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("would free"), "{}", stderr(&out));
    assert!(blob.exists());
    let out = bmoe(&hub.endpoint, &home, &["models", "rm", "owner/tiny:Tiny-Q8_0.gguf"], &[]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("freed"), "{}", stderr(&out));
    assert!(!blob.exists() && !snapshot(&home, "Tiny-Q8_0.gguf").exists());
    assert!(snapshot(&home, "BF16/Tiny-BF16-00002-of-00002.gguf").exists(), "other models stay");
    let out = bmoe(&hub.endpoint, &home, &["models", "rm", local.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("pass --yes"), "{}", stderr(&out));
    assert!(local.exists());
}

/// One name for a model: every name `bmoe models` prints, and the spec
/// `pull` took (with `hf:` or without), opens with `-m` and is taken by
/// `fit`, `inspect`, `template`, `cache remove --model` and `models rm`;
/// `cache list` names a hub model as `models` does. Removing the last model
/// of a repository leaves no folder behind.
#[test]
fn every_name_models_prints_is_taken_by_every_command() {
    let dir = common::tempdir();
    let hub = hub_with_models(dir.path());
    let home = dir.path().join("home");
    pull(&hub.endpoint, &home, "owner/tiny:q8_0");
    let local = dir.path().join("q4.gguf");
    let run = |args: &[&str]| {
        let out = bmoe(&hub.endpoint, &home, args, &[]);
        assert!(out.status.success(), "bmoe {args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&["generate", "-m", local.to_str().unwrap(), "-p", "hi", "-n", "1", "--moe-stream"]);
    let table = run(&["models"]);
    let names: Vec<String> = table
        .lines()
        .skip(1)
        .map(|l| {
            l.split("  ").last().unwrap().trim().trim_end_matches(" [hub]").trim_end_matches(" [demo]").to_string()
        })
        .collect();
    assert!(names.contains(&"owner/tiny:Tiny-Q8_0.gguf".to_string()), "{table}");
    let mut every = names.clone();
    every.extend(["owner/tiny:q8_0".to_string(), "hf:owner/tiny:q8_0".to_string()]);
    for name in &every {
        run(&["generate", "-m", name, "-p", "hi", "-n", "1"]);
        let fit = run(&["fit", "-m", name, "--disk-mbps", "500", "--compute-gws", "5"]);
        assert!(fit.contains("runs:") && fit.contains("run it:    bmoe chat "), "fit -m {name}: {fit}");
        assert!(run(&["inspect", name]).contains("qwen3moe"), "inspect {name}");
        run(&["template", name]);
        run(&["cache", "remove", "--model", name, "--dry-run"]);
    }
    // A live setting takes the names too: `:set model.path` in the REPL
    // goes through the same reopen as F2's `model.path` in the chat.
    for name in ["owner/tiny:q8_0", "hf:owner/tiny:Tiny-Q8_0.gguf"] {
        let mut child = standin::bmoe_command(&hub.endpoint, &home, &["repl", "-m", local.to_str().unwrap()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        std::io::Write::write_all(&mut stdin, format!(":set model.path {name}\n").as_bytes()).unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
        assert!(out.status.success() && said.contains("reopened") && said.contains("Tiny-Q8_0.gguf"), "{name}: {said}");
    }
    // A streamed run of the hub model leaves a route profile: `cache list`
    // names it as `models` does, and `cache remove --model SPEC` finds it.
    run(&["generate", "-m", "owner/tiny:q8_0", "-p", "hi", "-n", "2", "--moe-stream"]);
    let listing = run(&["cache", "list"]);
    assert!(listing.contains("owner/tiny:Tiny-Q8_0.gguf") && !listing.contains("blobs/"), "{listing}");
    let removed = run(&["cache", "remove", "--model", "owner/tiny:q8_0", "--dry-run"]);
    assert!(removed.contains("would free") && removed.contains("owner/tiny:Tiny-Q8_0.gguf"), "{removed}");
    // The spec pull took removes the model, and the repository's folder goes with its last model.
    let out = run(&["models", "rm", "owner/tiny:q8_0"]);
    assert!(out.contains("freed"), "{out}");
    assert!(!home.join("hub/models--owner--tiny").exists(), "an empty repository folder stayed");
    let out = bmoe(&hub.endpoint, &home, &["inspect", "owner/tiny:q8_0"], &[]);
    assert!(!out.status.success() && stderr(&out).contains("bmoe pull owner/tiny:q8_0"), "{}", stderr(&out));
}

#[test]
fn serve_opens_a_hub_model() {
    let dir = common::tempdir();
    let hub = hub_with_models(dir.path());
    let home = dir.path().join("home");
    let endpoint = PathBuf::from(&hub.endpoint);
    let env = [("HF_ENDPOINT", endpoint.as_path()), ("HF_HOME", home.as_path())];
    let server =
        common::serve::Serve::start_in(Path::new("hf:owner/tiny:Q8_0"), &["-q"], std::process::Stdio::inherit(), &env);
    let (status, models) = common::serve::get(&server.url, "/v1/models", None);
    assert_eq!(status, 200, "{models}");
    assert!(snapshot(&home, "Tiny-Q8_0.gguf").is_file(), "serve pulled the model into the hub cache");
}

#[test]
fn fit_reads_a_repository_without_downloading_it() {
    let dir = common::tempdir();
    let hub = hub_with_models(dir.path());
    let home = dir.path().join("home");
    let given = ["--disk-mbps", "500", "--compute-gws", "5", "--mem-mb"];
    let fit = |spec: &str, mem_mb: &str| {
        let args: Vec<&str> = ["fit", "-hf", spec].iter().chain(&given).chain(&[mem_mb]).copied().collect();
        let out = bmoe(&hub.endpoint, &home, &args, &[]);
        assert!(out.status.success(), "fit {spec}: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let report = fit("owner/tiny", "8192");
    for line in [
        "model:     owner/tiny: Tiny-Q4_K_M.gguf (headers read from the hub",
        "nothing downloaded",
        "shape:     qwen3moe",
        "memory:    8.0 GiB as given",
        "runs:      resident",
        "tok/s",
        "owner/tiny's quantizations",
        "(this one)",
    ] {
        assert!(report.contains(line), "no {line:?} in:\n{report}");
    }
    for tag in ["Q8_0", "BF16"] {
        assert!(report.lines().any(|l| l.trim_start().starts_with(tag)), "no {tag} row in:\n{report}");
    }
    // Every read of a file was a bounded range, together less than the file.
    let size = std::fs::metadata(dir.path().join("q4.gguf")).unwrap().len();
    let ranges: Vec<(u64, u64)> = hub
        .log()
        .into_iter()
        .filter(|(_, path, _)| path.starts_with("/blob/"))
        .map(|(_, path, range)| {
            let range = range.unwrap_or_else(|| panic!("{path} was fetched whole"));
            let (a, b) = range.trim_start_matches("bytes=").split_once('-').unwrap();
            (a.parse().unwrap(), b.parse().unwrap_or_else(|_| panic!("{path}: an open range {range}")))
        })
        .collect();
    assert!(!ranges.is_empty());
    assert!(ranges.iter().map(|(a, b)| b + 1 - a).sum::<u64>() < size, "{ranges:?} of {size}");
    assert!(!home.join("hub/models--owner--tiny/blobs").exists(), "fit downloaded nothing into the cache");
    // A split set: both shards' headers, still no download.
    let report = fit("owner/tiny:BF16", "8192");
    assert!(report.contains("Tiny-BF16-00001-of-00002.gguf, BF16/Tiny-BF16-00002-of-00002.gguf"), "{report}");
    // Too little memory for even the dense weights and the context.
    let report = fit("owner/tiny:Q8_0", "64");
    assert!(report.contains("runs:      no:"), "{report}");
    assert!(!home.join("hub/models--owner--tiny/blobs").exists());
    // An unknown tag lists what the repository has.
    let out = bmoe(&hub.endpoint, &home, &["fit", "-hf", "owner/tiny:Q2_K"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("Q4_K_M, Q8_0"), "{}", stderr(&out));
}

#[test]
fn fit_measures_this_machine_for_a_local_model() {
    let dir = common::tempdir();
    let model = dir.path().join("tiny-q4.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["make-model", "-q", "--preset", "tiny", "--quant", "q4_0", "-o"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["fit", "-m"])
        .arg(&model)
        .env("XDG_CACHE_HOME", dir.path().join("xdg"))
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    // The probes ran: a disk rate on the model's own file and a compute rate
    // from llama.cpp decoding a probe model in the model's expert type.
    assert!(report.contains("lanes (the model's file)"), "{report}");
    assert!(report.contains("G weights/s (experts q4_0"), "{report}");
    assert!(report.contains("runs:      resident"), "{report}");
    assert!(report.lines().any(|l| l.starts_with("speed:") && l.contains("tok/s")), "{report}");
    let left: Vec<_> =
        std::fs::read_dir(dir.path().join("xdg/bmoe")).map(|d| d.flatten().collect()).unwrap_or_default();
    assert!(left.iter().all(|e| !e.file_name().to_string_lossy().contains("probe")), "the probe model was left behind");
}

#[test]
fn a_large_file_comes_over_ranges_and_a_cut_one_continues_each() {
    let dir = common::tempdir();
    // 70 MiB of bytes that differ everywhere (a shifted range would show).
    let mut bytes = Vec::with_capacity(70 << 20);
    let mut x: u64 = 0x9e3779b97f4a7c15;
    while bytes.len() < 70 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(dir.path().join("big.gguf"), &bytes).unwrap();
    let hub = FakeHub::start();
    hub.add(
        "owner/big",
        HubRepo {
            commit: COMMIT.into(),
            files: vec![HubFile::from_path("Big-Q4_K_M.gguf", &dir.path().join("big.gguf"))],
            gated_token: None,
        },
    );
    let home = dir.path().join("home");
    hub.inject(Faults { cut_after: Some(3 << 20), ..Faults::default() });
    let out = bmoe(&hub.endpoint, &home, &["pull", "owner/big"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("run the same command to continue"), "{}", stderr(&out));
    let first: Vec<String> =
        hub.log().into_iter().filter(|(_, p, _)| p.starts_with("/blob/")).filter_map(|(_, _, r)| r).collect();
    assert_eq!(first.len(), 4, "four connections, each a range: {first:?}");
    let seen = hub.log().len();
    let path = pull(&hub.endpoint, &home, "owner/big");
    assert!(read(&path) == bytes, "the continued file is byte-identical");
    // The second pull asked only for what each range still lacked.
    let second: Vec<(u64, u64)> = hub.log()[seen..]
        .iter()
        .filter(|(_, p, _)| p.starts_with("/blob/"))
        .map(|(_, _, r)| {
            let (a, b) = r.as_deref().unwrap().trim_start_matches("bytes=").split_once('-').unwrap();
            (a.parse().unwrap(), b.parse().unwrap())
        })
        .collect();
    let refetched: u64 = second.iter().map(|(a, b)| b + 1 - a).sum();
    assert!(!second.is_empty() && refetched < bytes.len() as u64, "{second:?}");
    assert!(second.iter().any(|(a, _)| a % (bytes.len() as u64 / 4) != 0), "a range continued mid-way: {second:?}");
    assert!(
        !home
            .join("hub/models--owner--big/blobs")
            .read_dir()
            .unwrap()
            .any(|e| { e.unwrap().file_name().to_string_lossy().contains("incomplete") })
    );
}
