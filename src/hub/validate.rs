//! Checks on every string the hub (or a mirror, or anyone between) sends
//! before it becomes part of a path, a size or a message: repository ids,
//! revisions and the commits refs hold, SHA-256s, git blob ids and file
//! names, the rules `huggingface_hub` applies. A string that fails is
//! refused with the field it came in, shown escaped.

/// Longest part of a repository id (`huggingface_hub` allows 96).
const MAX_REPO_PART: usize = 96;

/// Longest file name or revision taken.
const MAX_NAME: usize = 1024;

/// `owner/name`: each part 1-96 of letters, digits, `-`, `_` and `.`, not
/// starting or ending with `-` or `.`, with no `--` or `..` (the cache
/// folder `models--OWNER--NAME` must name one repository).
pub fn repo_id(repo: &str) -> Result<(), String> {
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.len() <= MAX_REPO_PART
            && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && !p.starts_with(['-', '.'])
            && !p.ends_with(['-', '.'])
            && !p.contains("--")
            && !p.contains("..")
    };
    match repo.split_once('/') {
        Some((owner, name)) if part_ok(owner) && part_ok(name) => Ok(()),
        _ => Err(format!(
            "repository id {}: OWNER/NAME of letters, digits, '-', '_' and '.' (at most {MAX_REPO_PART} each, no \
             '--' or '..', not starting or ending with '-' or '.')",
            shown(repo)
        )),
    }
}

/// A commit: 40 hex digits.
pub fn is_commit(text: &str) -> bool {
    text.len() == 40 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A revision: a commit, or a branch or tag name whose `/`-separated parts
/// are non-empty, not `.` or `..`, not starting with `.`, of printable
/// characters other than `\ ~ ^ : ? * [` and space.
pub fn revision(text: &str) -> Result<(), String> {
    let part_ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with('.')
            && !p.ends_with(".lock")
            && p.chars().all(|c| c.is_ascii_graphic() && !"\\~^:?*[".contains(c))
    };
    if is_commit(text) || (text.len() <= MAX_NAME && text.split('/').all(part_ok)) {
        Ok(())
    } else {
        Err(format!(
            "revision {}: a commit (40 hex digits) or a branch or tag name (no empty, '.' or '..' parts)",
            shown(text)
        ))
    }
}

/// A SHA-256 as the listing's `lfs.sha256` gives it: 64 hex digits
/// (returned in lower case).
pub fn sha256(text: &str) -> Result<String, String> {
    if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(text.to_ascii_lowercase())
    } else {
        Err(format!("lfs.sha256 {}: not 64 hex digits", shown(text)))
    }
}

/// A git blob id as the listing's `blobId` gives it: 40 hex digits
/// (returned in lower case).
pub fn blob_id(text: &str) -> Result<String, String> {
    if is_commit(text) {
        Ok(text.to_ascii_lowercase())
    } else {
        Err(format!("blobId {}: not 40 hex digits", shown(text)))
    }
}

/// A file's path in a repository (`rfilename`): relative, `/`-separated
/// parts that are neither empty nor `.` or `..`, no control characters or
/// backslashes, at most 1024 bytes.
pub fn file_name(text: &str) -> Result<(), String> {
    let part_ok = |p: &str| !p.is_empty() && p != "." && p != "..";
    let ok = !text.is_empty()
        && text.len() <= MAX_NAME
        && !text.chars().any(|c| c.is_control() || c == '\\')
        && text.split('/').all(part_ok);
    if ok { Ok(()) } else { Err(format!("rfilename {}: not a relative path inside the repository", shown(text))) }
}

/// `text` as it may reach a terminal: quoted, control characters (escape
/// codes, newlines) escaped, cut after 200 characters ([`crate::text::excerpt`]).
pub fn shown(text: &str) -> String {
    format!("\"{}\"", crate::text::excerpt(&text.replace('"', "\\\""), 200))
}

/// `text` for a terminal: control characters escaped, cut after 200
/// characters.
pub fn printable(text: &str) -> String {
    crate::text::excerpt(text, 200)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_ids_follow_the_hubs_rules() {
        for good in ["unsloth/Qwen3-30B-A3B-GGUF", "a/b", "owner_1/x.y-z"] {
            assert!(repo_id(good).is_ok(), "{good}");
        }
        for bad in ["evil--normal/x", "evil/normal--x", "a/..", "../b", "a/b/c", "a", "-a/b", "a/b.", "a b/c", "a/"] {
            assert!(repo_id(bad).unwrap_err().contains("repository id"), "{bad}");
        }
        assert!(repo_id(&format!("a/{}", "x".repeat(97))).is_err());
    }

    #[test]
    fn revisions_hashes_and_names_refuse_what_would_leave_the_folder() {
        for good in ["main", "v1.0", "refs/pr/1", "0123456789abcdef0123456789abcdef01234567"] {
            assert!(revision(good).is_ok(), "{good}");
        }
        for bad in ["../x", "a/../b", "/abs", "a//b", "", ".hidden", "a b", "x\n", "a/b.lock"] {
            assert!(revision(bad).is_err(), "{bad:?}");
        }
        assert_eq!(sha256(&"AB".repeat(32)).unwrap(), "ab".repeat(32));
        for bad in ["../../path", &"a".repeat(63), &"g".repeat(64)] {
            assert!(sha256(bad).unwrap_err().contains("lfs.sha256"), "{bad}");
        }
        assert!(blob_id(&"0".repeat(40)).is_ok());
        assert!(blob_id("../../../../victim").unwrap_err().contains("blobId"));
        for good in ["model.gguf", "sub/dir/model-00001-of-00002.gguf", "..hidden.gguf"] {
            assert!(file_name(good).is_ok(), "{good}");
        }
        for bad in ["../../../../a.gguf", "/etc/a.gguf", "sub/../../a.gguf", "a//b", "./a", "a\nb", "a\\b", ""] {
            assert!(file_name(bad).unwrap_err().contains("rfilename"), "{bad:?}");
        }
    }

    #[test]
    fn shown_text_is_quoted_escaped_and_cut() {
        assert_eq!(shown("a\u{1b}[31m\"red\"\n"), "\"a\\u{1b}[31m\\\"red\\\"\\n\"");
        assert_eq!(printable("plain.gguf"), "plain.gguf");
        let long = shown(&"x".repeat(1 << 20));
        assert!(long.len() < 260 && long.ends_with("(1048576 bytes)\""), "{long}");
    }
}
