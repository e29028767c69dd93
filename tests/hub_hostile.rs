//! A hostile hub (or a mirror, or anyone between): crafted listings served
//! by the stand-in over real HTTP on 127.0.0.1, each refused with one line
//! naming the field, and nothing outside the model's cache folder created,
//! changed, linked or removed. Also two pulls of one file at once, a
//! planted link in the cache, a header that claims 200 MiB, and Ctrl-C in
//! a stalled download.

mod common;
#[path = "common/hub.rs"]
mod standin;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use standin::{FakeHub, Faults, HubFile, HubRepo};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// A stand-in serving `owner/tiny` with one tiny model, `Tiny-Q8_0.gguf`.
fn hub_with_tiny(dir: &Path) -> (FakeHub, HubFile) {
    let model = dir.join("tiny.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["make-model", "-q", "--preset", "tiny", "-o"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let hub = FakeHub::start();
    hub.add(
        "owner/tiny",
        HubRepo { commit: COMMIT.into(), files: vec![HubFile::from_path("Tiny-Q8_0.gguf", &model)], gated_token: None },
    );
    (hub, HubFile::from_path("Tiny-Q8_0.gguf", &model))
}

fn bmoe(hub: &str, home: &Path, args: &[&str]) -> Output {
    command(hub, home, args).output().unwrap()
}

fn command(hub: &str, home: &Path, args: &[&str]) -> Command {
    standin::bmoe_command(hub, home, args)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every file, link and folder under `root` with what it holds (a link:
/// its target), to compare before and after.
fn tree(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let path = e.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let what = if meta.file_type().is_symlink() {
                format!("link to {}", std::fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                stack.push(path.clone());
                "folder".into()
            } else {
                format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()))
            };
            out.insert(path, what);
        }
    }
    out
}

/// The listing JSON of one file with the given fields.
fn listing(sibling: Value) -> Value {
    json!({"id": "owner/tiny", "sha": COMMIT, "siblings": [sibling]})
}

/// Each crafted listing: `pull` exits non-zero with one line naming the
/// field (control characters escaped), and nothing outside the repository's
/// cache folder changes: the victim file, the folders around the cache.
#[test]
fn crafted_listings_are_refused_and_touch_nothing_outside_the_cache() {
    let dir = common::tempdir();
    let (hub, file) = hub_with_tiny(dir.path());
    let home = dir.path().join("deep/a/b/c/home");
    std::fs::create_dir_all(&home).unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let size = file.bytes.len();
    let lfs = json!({"sha256": file.sha256, "size": size});
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "a blob id that climbs out",
            json!({"rfilename": "Tiny-Q8_0.gguf", "size": size,
            "blobId": "../../../../../../../victim"}),
            "blobId",
        ),
        (
            "a file name that climbs out",
            json!({"rfilename": "../../../../a.gguf", "size": size, "lfs": lfs}),
            "rfilename",
        ),
        (
            "an absolute file name",
            json!({"rfilename": victim.to_str().unwrap(), "size": size, "lfs": lfs}),
            "rfilename",
        ),
        (
            "a file name climbing out of a folder",
            json!({"rfilename": "sub/../../a.gguf", "size": size, "lfs": lfs}),
            "rfilename",
        ),
        (
            "a hash that climbs out",
            json!({"rfilename": "Tiny-Q8_0.gguf", "size": size,
            "lfs": {"sha256": "../../../../../../../victim", "size": 8}}),
            "lfs.sha256",
        ),
        (
            "no hash and no blob id",
            json!({"rfilename": "Tiny-Q8_0.gguf", "size": size}),
            "neither lfs.sha256 nor blobId",
        ),
        (
            "a name with a newline and an escape code",
            json!({"rfilename": "Tiny\n\u{1b}[2J-Q8_0.gguf", "size": size,
            "lfs": lfs}),
            "rfilename",
        ),
    ];
    let before = tree(dir.path());
    for (what, sibling, field) in cases {
        hub.set_listing("owner/tiny", listing(sibling));
        for args in [&["pull", "owner/tiny:Tiny-Q8_0.gguf"][..], &["generate", "-hf", "owner/tiny:q8_0", "-n", "1"]] {
            let out = bmoe(&hub.endpoint, &home, args);
            let err = stderr(&out);
            assert!(!out.status.success(), "{what}: {args:?} succeeded: {err}");
            assert!(err.contains(field) && err.contains("listing is refused"), "{what}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{what}: {err}");
            assert!(!err.contains('\u{1b}'), "{what}: an escape code reached the terminal: {err:?}");
        }
        let after = tree(dir.path());
        let outside: Vec<_> = after
            .iter()
            .filter(|(p, _)| !p.starts_with(home.join("hub/models--owner--tiny")) && !p.starts_with(home.join("xdg")))
            .filter(|(p, v)| before.get(*p) != Some(*v))
            .collect();
        assert!(outside.is_empty(), "{what}: changed outside the cache folder: {outside:?}");
        assert!(before.iter().all(|(p, v)| after.get(p) == Some(v)), "{what}: something was removed or changed");
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
}

/// Repository ids that would share a cache folder, revisions and refs that
/// would leave it: refused, or not followed.
#[test]
fn ids_revisions_and_refs_cannot_leave_the_cache() {
    let dir = common::tempdir();
    let (hub, _) = hub_with_tiny(dir.path());
    let home = dir.path().join("home");
    for spec in ["evil--normal/x", "evil/normal--x", "owner/../tiny", "owner/tiny:../x.gguf"] {
        let out = bmoe(&hub.endpoint, &home, &["pull", spec]);
        assert!(!out.status.success() && stderr(&out).contains("is not a hub model"), "{spec}: {}", stderr(&out));
    }
    let out = bmoe(&hub.endpoint, &home, &["pull", "owner/tiny:q8_0", "--revision", "../x"]);
    assert!(!out.status.success() && stderr(&out).contains("revision \"../x\""), "{}", stderr(&out));
    assert!(!dir.path().join("x").exists() && !home.join("hub/x").exists());
    // A pulled model whose refs/main is made to point out of the cache:
    // offline, it is not followed.
    let out = bmoe(&hub.endpoint, &home, &["pull", "owner/tiny:q8_0"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(outside.join("snapshots-like")).unwrap();
    std::fs::write(home.join("hub/models--owner--tiny/refs/main"), "../../../outside").unwrap();
    let out =
        command(&hub.endpoint, &home, &["inspect", "owner/tiny:q8_0"]).env("HF_HUB_OFFLINE", "1").output().unwrap();
    assert!(!out.status.success() && stderr(&out).contains("bmoe pull owner/tiny:q8_0"), "{}", stderr(&out));
}

/// A partial download planted as a link to a file outside: refused, the
/// file untouched.
#[test]
fn a_planted_link_in_the_cache_is_not_followed() {
    let dir = common::tempdir();
    let (hub, file) = hub_with_tiny(dir.path());
    let home = dir.path().join("home");
    let blobs = home.join("hub/models--owner--tiny/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, blobs.join(format!("{}.incomplete", file.sha256))).unwrap();
    let out = bmoe(&hub.endpoint, &home, &["pull", "owner/tiny:q8_0"]);
    assert!(!out.status.success() && stderr(&out).contains("is a symbolic link"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    // A snapshot folder planted as a link out of the cache: refused too.
    std::fs::remove_file(blobs.join(format!("{}.incomplete", file.sha256))).unwrap();
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir_all(home.join("hub/models--owner--tiny/snapshots")).unwrap();
    std::os::unix::fs::symlink(&outside, home.join("hub/models--owner--tiny/snapshots").join(COMMIT)).unwrap();
    let out = bmoe(&hub.endpoint, &home, &["pull", "owner/tiny:q8_0"]);
    assert!(
        !out.status.success() && stderr(&out).contains("outside the repository's cache folder"),
        "{}",
        stderr(&out)
    );
    assert!(std::fs::read_dir(&outside).unwrap().next().is_none(), "a link was made outside");
}

/// Two pulls of one file at once: one waits for the other's lock, and
/// both end with the right blob.
#[test]
fn two_pulls_at_once_leave_the_right_blob() {
    let dir = common::tempdir();
    let (hub, file) = hub_with_tiny(dir.path());
    let home = dir.path().join("home");
    // Slow enough that the second starts while the first downloads.
    hub.inject(Faults { slow_ms: Some(30), ..Faults::default() });
    let first = command(&hub.endpoint, &home, &["pull", "--connections", "1", "owner/tiny:q8_0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let second = bmoe(&hub.endpoint, &home, &["pull", "--connections", "1", "owner/tiny:q8_0"]);
    let first = first.wait_with_output().unwrap();
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(second.status.success(), "{}", stderr(&second));
    let blob = home.join("hub/models--owner--tiny/blobs").join(&file.sha256);
    assert_eq!(format!("{:x}", Sha256::digest(std::fs::read(&blob).unwrap())), file.sha256);
    let leftovers: Vec<_> = std::fs::read_dir(blob.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| *n != file.sha256)
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// `fit -hf` on a file whose header claims a 200 MiB string: refused,
/// reading a bounded window (its peak memory under 128 MiB).
#[test]
fn a_header_claiming_200_mib_is_refused_in_bounded_memory() {
    let dir = common::tempdir();
    // A GGUF header: magic, version 3, 0 tensors, 1 key, the key, a string
    // type, then a string length of 200 MiB, and the bytes (the file is as
    // long as the string claims, so only a window can stop the read).
    let mut bytes = Vec::new();
    bytes.extend_from_slice(b"GGUF");
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    let key = b"general.architecture";
    bytes.extend_from_slice(&(key.len() as u64).to_le_bytes());
    bytes.extend_from_slice(key);
    bytes.extend_from_slice(&8u32.to_le_bytes());
    bytes.extend_from_slice(&(200u64 << 20).to_le_bytes());
    bytes.resize(bytes.len() + (201 << 20), b'q');
    let path = dir.path().join("liar.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let hub = FakeHub::start();
    hub.add(
        "owner/liar",
        HubRepo { commit: COMMIT.into(), files: vec![HubFile::from_path("Liar-Q8_0.gguf", &path)], gated_token: None },
    );
    let home = dir.path().join("home");
    // Its peak resident set is read by a small Python parent (this test's
    // own memory, which holds the file, would count in a child forked
    // from it: Linux keeps the larger high-water mark across exec).
    let measure = "import resource, subprocess, sys\n\
        r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n\
        sys.stderr.buffer.write(r.stderr)\n\
        print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n\
        sys.exit(r.returncode)";
    let out = Command::new("python3")
        .args(["-c", measure, env!("CARGO_BIN_EXE_bmoe"), "fit", "-hf", "owner/liar", "--disk-mbps", "500"])
        .args(["--compute-gws", "5"])
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HOME", &home)
        .env("XDG_CACHE_HOME", home.join("xdg"))
        .env_remove("HF_HUB_OFFLINE")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("header goes on past 32.0 MiB"), "{err}");
    let peak_kib: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    eprintln!("fit -hf on the 200 MiB claim: peak RSS {} MiB", peak_kib >> 10);
    assert!(peak_kib < 128 << 10, "fit peaked at {} MiB", peak_kib >> 10);
}

/// Ctrl-C in a download whose body stalled: the pull stops at once with
/// status 130 and keeps what it had, so the next pull continues.
#[test]
fn ctrl_c_stops_a_stalled_download_and_keeps_it() {
    let dir = common::tempdir();
    let (hub, file) = hub_with_tiny(dir.path());
    let home = dir.path().join("home");
    hub.inject(Faults { stall_after: Some(1 << 20), ..Faults::default() });
    let child = command(&hub.endpoint, &home, &["pull", "--connections", "1", "owner/tiny:q8_0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let partial = home.join("hub/models--owner--tiny/blobs").join(format!("{}.incomplete", file.sha256));
    // The stalled bytes are on disk: the pull now waits on the connection
    // (the stand-in holds it for ten minutes).
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::metadata(&partial).map_or(0, |m| m.len()) < 1 << 20 {
        assert!(Instant::now() < deadline, "the first megabyte never arrived");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: sends SIGINT to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(stderr(&out).contains("run the same command to continue"), "{}", stderr(&out));
    assert_eq!(std::fs::metadata(&partial).unwrap().len(), 1 << 20, "the partial download was not kept");
    // The next pull continues it and ends with the right file.
    let out = bmoe(&hub.endpoint, &home, &["pull", "--connections", "1", "owner/tiny:q8_0"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let blob = home.join("hub/models--owner--tiny/blobs").join(&file.sha256);
    assert_eq!(std::fs::read(blob).unwrap(), file.bytes);
}
