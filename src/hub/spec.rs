//! `REPO[:QUANT]`: which repository, and which of its GGUF files.

use std::fmt;
use std::str::FromStr;

/// A model on the hub: `owner/name`, optionally `:QUANT` (a quantization
/// tag such as `Q4_K_M`, any case) or `:FILE.gguf` (that file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubSpec {
    /// `owner/name`.
    pub repo: String,
    /// The quantization tag or file name after `:`, if any.
    pub selector: Option<String>,
    /// The branch, tag or commit (`main`).
    pub revision: String,
}

impl HubSpec {
    /// The spec in `-m hf:REPO[:QUANT]`, when `model` is one.
    pub fn from_model_arg(model: &str) -> Option<Result<HubSpec, String>> {
        model.strip_prefix("hf:").map(str::parse)
    }
}

impl FromStr for HubSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<HubSpec, String> {
        let (repo, selector) = match text.split_once(':') {
            Some((repo, sel)) if !sel.is_empty() => (repo, Some(sel.to_string())),
            Some((repo, _)) => (repo, None),
            None => (text, None),
        };
        if let Err(why) = super::validate::repo_id(repo) {
            return Err(format!(
                "{} is not a hub model ({why}): write OWNER/NAME[:QUANT], e.g. unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M",
                super::validate::shown(text)
            ));
        }
        if let Some(sel) = &selector
            && let Err(why) = super::validate::file_name(sel)
        {
            return Err(format!(
                "{} is not a hub model (after ':' a quantization tag or a file's path in the repository: {why}): \
                 write OWNER/NAME[:QUANT]",
                super::validate::shown(text)
            ));
        }
        Ok(HubSpec { repo: repo.to_string(), selector, revision: "main".into() })
    }
}

impl fmt::Display for HubSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.selector {
            Some(sel) => write!(f, "{}:{sel}", self.repo),
            None => f.write_str(&self.repo),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_the_form() {
        let s: HubSpec = "unsloth/Qwen3-30B-A3B-GGUF:q4_k_m".parse().unwrap();
        assert_eq!((s.repo.as_str(), s.selector.as_deref()), ("unsloth/Qwen3-30B-A3B-GGUF", Some("q4_k_m")));
        let s: HubSpec = "a/b".parse().unwrap();
        assert_eq!(s.selector, None);
        assert_eq!(HubSpec::from_model_arg("hf:a/b:x.gguf").unwrap().unwrap().selector.as_deref(), Some("x.gguf"));
        assert!(HubSpec::from_model_arg("model.gguf").is_none());
        for bad in ["qwen", "a/b/c", "/b", "a/", "a/../b", "a b/c", "evil--normal/x", "evil/normal--x", "a/b:../x"] {
            assert!(bad.parse::<HubSpec>().unwrap_err().contains("OWNER/NAME"), "{bad}");
        }
    }
}
