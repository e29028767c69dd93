//! Where the hub is and where its files go, read from the environment the
//! way Hugging Face's own tools read it.

use std::path::PathBuf;

/// The hub's address, the token, the cache folder and whether to stay
/// offline.
#[derive(Debug, Clone)]
pub struct HubSettings {
    /// `HF_ENDPOINT` (default `https://huggingface.co`), without a trailing `/`.
    pub endpoint: String,
    /// `HF_TOKEN`, else the token file (`HF_TOKEN_PATH`, else `$HF_HOME/token`).
    pub token: Option<String>,
    /// The hub cache: `HF_HUB_CACHE`, else `$HF_HOME/hub`, else
    /// `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.
    pub cache: PathBuf,
    /// `HF_HUB_OFFLINE` is 1, on, yes or true: only the cache is used.
    pub offline: bool,
    /// Connections a large file is fetched over, each a byte range
    /// (`bmoe pull --connections`; 1 fetches it in one stream).
    pub connections: usize,
}

/// Connections by default: where storage paces each connection, four
/// ranges at once fetched 3.5x as fast (`scripts/pull-bench.py`,
/// docs/models.md, "A download").
pub const DEFAULT_CONNECTIONS: u16 = 4;

impl HubSettings {
    /// The settings of this process's environment.
    pub fn from_env() -> HubSettings {
        HubSettings::from_vars(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// The settings from `var` (an environment lookup).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> HubSettings {
        let home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            let base = var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| dirs::home_dir().map(|h| h.join(".cache")))
                .unwrap_or_else(std::env::temp_dir);
            base.join("huggingface")
        });
        let cache = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")).map(PathBuf::from);
        let token = var("HF_TOKEN").or_else(|| var("HUGGING_FACE_HUB_TOKEN")).or_else(|| {
            let file = var("HF_TOKEN_PATH").map(PathBuf::from).unwrap_or_else(|| home.join("token"));
            std::fs::read_to_string(file).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
        });
        let offline = ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"]
            .iter()
            .filter_map(|name| var(name))
            .any(|v| ["1", "ON", "YES", "TRUE"].contains(&v.trim().to_uppercase().as_str()));
        HubSettings {
            endpoint: var("HF_ENDPOINT")
                .unwrap_or_else(|| "https://huggingface.co".into())
                .trim_end_matches('/')
                .into(),
            token,
            cache: cache.unwrap_or_else(|| home.join("hub")),
            offline,
            connections: usize::from(DEFAULT_CONNECTIONS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> HubSettings {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        HubSettings::from_vars(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn the_environment_decides_as_huggingface_hub_does() {
        let s = settings(&[("HF_HOME", "/h"), ("HF_ENDPOINT", "http://127.0.0.1:9/"), ("HF_HUB_OFFLINE", "yes")]);
        assert_eq!(s.cache, PathBuf::from("/h/hub"));
        assert_eq!(s.endpoint, "http://127.0.0.1:9");
        assert!(s.offline);
        let s = settings(&[("XDG_CACHE_HOME", "/x"), ("HF_TOKEN", "t"), ("HF_HUB_OFFLINE", "0")]);
        assert_eq!(s.cache, PathBuf::from("/x/huggingface/hub"));
        assert_eq!(s.token.as_deref(), Some("t"));
        assert!(!s.offline);
        let s = settings(&[("HF_HOME", "/h"), ("HF_HUB_CACHE", "/c")]);
        assert_eq!(s.cache, PathBuf::from("/c"));
        assert_eq!(s.endpoint, "https://huggingface.co");
    }
}
