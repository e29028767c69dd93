//! Which of a repository's files a `:QUANT` or `:FILE` means, as llama.cpp's
//! `-hf` picks: the GGUF whose name carries the quantization tag (any case;
//! `Q4_K_M` when none is given, else the only model), with every shard of a
//! split set.

use std::collections::BTreeSet;

use super::RepoFile;

/// The tag tried when a spec names none.
const DEFAULT_TAG: &str = "Q4_K_M";

/// The files `selector` picks from `files`: one GGUF, or a split set's
/// shards in order. The error lists what the repository has.
pub fn select_files<'f>(files: &'f [RepoFile], selector: Option<&str>) -> Result<Vec<&'f RepoFile>, String> {
    let models: Vec<&RepoFile> = files.iter().filter(|f| is_model(&f.name)).collect();
    if models.is_empty() {
        return Err("the repository has no GGUF model file".into());
    }
    let sets = match selector {
        Some(name) if name.to_ascii_lowercase().ends_with(".gguf") => {
            let Some(file) = models.iter().find(|f| f.name == name || base(&f.name) == name) else {
                return Err(format!("no file {name}; its GGUF files: {}", names(&models)));
            };
            vec![set_of(&file.name)]
        }
        Some(tag) => tagged_sets(&models, tag),
        None => {
            let tagged = tagged_sets(&models, DEFAULT_TAG);
            if tagged.is_empty() {
                models.iter().map(|f| set_of(&f.name)).collect::<BTreeSet<_>>().into_iter().collect()
            } else {
                tagged
            }
        }
    };
    match sets.as_slice() {
        [] => Err(format!(
            "no GGUF file is quantized {}; it has {}",
            selector.unwrap_or(DEFAULT_TAG),
            quantizations(files).join(", ")
        )),
        [set] => shards(&models, set),
        many => Err(format!(
            "{} models match{}: name one with :FILE.gguf ({})",
            many.len(),
            selector.map(|s| format!(" {s}")).unwrap_or_default(),
            many.join(", ")
        )),
    }
}

/// The quantization tags of a repository's GGUF files, as `:QUANT` takes
/// them (the last `-` or `.` separated part of each name).
pub fn quantizations(files: &[RepoFile]) -> Vec<String> {
    let tags: BTreeSet<String> = files
        .iter()
        .filter(|f| is_model(&f.name))
        .map(|f| {
            let stem = set_of(&f.name);
            let stem = base(&stem).trim_end_matches(".gguf").trim_end_matches(".GGUF").to_string();
            stem.rsplit(['-', '.']).next().unwrap_or(&stem).to_string()
        })
        .collect();
    tags.into_iter().collect()
}

/// A model file: a GGUF that is not a vision projector.
pub(super) fn is_model(name: &str) -> bool {
    name.to_ascii_lowercase().ends_with(".gguf") && !base(name).to_ascii_lowercase().contains("mmproj")
}

/// The file name without its folders.
fn base(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// The split set's name: `-00001-of-00003` taken out (the name itself when
/// the file is whole).
pub fn set_of(name: &str) -> String {
    split_part(name)
        .map(|(_, _, at)| format!("{}{}", &name[..at], &name[at + 15..]))
        .unwrap_or_else(|| name.to_string())
}

/// A shard's number, the count and where `-NNNNN-of-MMMMM` starts.
fn split_part(name: &str) -> Option<(u32, u32, usize)> {
    let of = name.rfind("-of-")?;
    let at = of.checked_sub(6)?;
    let (shard, count) = (name.get(at + 1..of)?, name.get(of + 4..of + 9)?);
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if name.as_bytes()[at] != b'-' || !digits(shard) || !digits(count) {
        return None;
    }
    Some((shard.parse().ok()?, count.parse().ok()?, at))
}

/// The sets whose names carry `tag` between separators (any case: `q4_k_m`
/// is `Q4_K_M`, and `Q4_K` does not match `Q4_K_M`).
fn tagged_sets(models: &[&RepoFile], tag: &str) -> Vec<String> {
    let tag = tag.to_ascii_uppercase();
    let sets: BTreeSet<String> = models
        .iter()
        .map(|f| set_of(&f.name))
        .filter(|set| {
            let upper = set.to_ascii_uppercase();
            upper.match_indices(&tag).any(|(at, _)| {
                let before = upper[..at].chars().next_back();
                let after = upper[at + tag.len()..].chars().next();
                !before.is_some_and(|c| c.is_ascii_alphanumeric())
                    && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            })
        })
        .collect();
    sets.into_iter().collect()
}

/// The files of `set`: itself, or every shard in order (all present).
fn shards<'f>(models: &[&'f RepoFile], set: &str) -> Result<Vec<&'f RepoFile>, String> {
    let mut parts: Vec<(u32, u32, &RepoFile)> = models
        .iter()
        .filter(|f| set_of(&f.name) == set)
        .map(|f| match split_part(&f.name) {
            Some((shard, count, _)) => (shard, count, *f),
            None => (1, 1, *f),
        })
        .collect();
    parts.sort_by_key(|(shard, _, _)| *shard);
    let count = parts.first().map(|p| p.1).unwrap_or(0);
    let complete = parts.len() == count as usize
        && parts.iter().enumerate().all(|(i, (shard, c, _))| *shard == i as u32 + 1 && *c == count);
    if !complete {
        return Err(format!("{set} is split in {count} shards and the repository has {} of them", parts.len()));
    }
    Ok(parts.into_iter().map(|(_, _, f)| f).collect())
}

/// The files' names, for an error.
fn names(files: &[&RepoFile]) -> String {
    files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(names: &[&str]) -> Vec<RepoFile> {
        names.iter().map(|n| RepoFile { name: n.to_string(), size: 1, sha256: None, blob: String::new() }).collect()
    }

    fn picked(files: &[RepoFile], selector: Option<&str>) -> Result<Vec<String>, String> {
        select_files(files, selector).map(|f| f.iter().map(|f| f.name.clone()).collect())
    }

    #[test]
    fn tags_pick_files_as_llama_cpp_does() {
        let files = repo(&[
            "README.md",
            "M-Q4_K.gguf",
            "M-Q4_K_M.gguf",
            "M-Q8_0.gguf",
            "mmproj-M-F16.gguf",
            "BF16/M-BF16-00002-of-00002.gguf",
            "BF16/M-BF16-00001-of-00002.gguf",
        ]);
        assert_eq!(picked(&files, None).unwrap(), ["M-Q4_K_M.gguf"]);
        assert_eq!(picked(&files, Some("q4_k")).unwrap(), ["M-Q4_K.gguf"]);
        assert_eq!(picked(&files, Some("Q8_0")).unwrap(), ["M-Q8_0.gguf"]);
        assert_eq!(
            picked(&files, Some("bf16")).unwrap(),
            ["BF16/M-BF16-00001-of-00002.gguf", "BF16/M-BF16-00002-of-00002.gguf"]
        );
        assert_eq!(picked(&files, Some("M-Q8_0.gguf")).unwrap(), ["M-Q8_0.gguf"]);
        let e = picked(&files, Some("IQ2_XS")).unwrap_err();
        assert_eq!(e, "no GGUF file is quantized IQ2_XS; it has BF16, Q4_K, Q4_K_M, Q8_0");
        assert!(picked(&files, Some("x.gguf")).unwrap_err().starts_with("no file x.gguf"));
    }

    #[test]
    fn one_model_needs_no_tag_and_a_missing_shard_is_an_error() {
        assert_eq!(picked(&repo(&["only-F16.gguf"]), None).unwrap(), ["only-F16.gguf"]);
        assert!(picked(&repo(&["a-Q8_0.gguf", "a-F16.gguf"]), None).unwrap_err().contains("2 models match"));
        let e = picked(&repo(&["m-Q4_K_M-00001-of-00003.gguf", "m-Q4_K_M-00003-of-00003.gguf"]), None).unwrap_err();
        assert!(e.contains("split in 3 shards and the repository has 2"), "{e}");
        assert!(picked(&repo(&["README.md"]), None).unwrap_err().contains("no GGUF"));
    }
}
