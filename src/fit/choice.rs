//! `moe.stream = auto`: whether a run streams its experts, decided at open
//! from the model's header and the memory this process may use, with the
//! same arithmetic as `bmoe fit` and the auto cache budget.

use std::path::Path;

use super::{Machine, Mode, ModelShape, estimate};
use crate::config::StreamMode;
use crate::gguf::ModelFiles;
use crate::moe::budget::MemoryLimits;
use crate::units::{size, sizes};

/// Whether a run streams, and why, in words for the user.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamChoice {
    /// Stream routed experts from disk.
    pub on: bool,
    /// Why: what `moe.stream` said, or how the model compares to memory.
    pub why: String,
}

impl StreamChoice {
    /// The one line every front end shows at open.
    pub fn notice(&self) -> String {
        let what = if self.on { "streaming experts from disk" } else { "resident (not streaming)" };
        format!("{what}: {}", self.why)
    }
}

/// Decides `moe.stream` for `model` with a context of `n_ctx` positions
/// (every sequence's together) under `memory`. `needed_by` names a setting
/// that needs streaming ([`crate::config::RunConfig::stream_needed_by`]):
/// under `auto` it streams whatever the model's size. `auto` otherwise
/// streams when the file and its context do not fit (`bmoe fit`'s verdict)
/// and the file can stream; it stays resident when the memory is unknown or
/// the header cannot be read (opening the model then says what is wrong).
pub fn choose_streaming(
    mode: StreamMode,
    needed_by: Option<&str>,
    model: &Path,
    n_ctx: u32,
    memory: &MemoryLimits,
) -> StreamChoice {
    let choice = |on: bool, why: String| StreamChoice { on, why };
    match (mode, needed_by) {
        (StreamMode::On, _) => return choice(true, "moe.stream is on (--moe-stream)".into()),
        (StreamMode::Off, _) => return choice(false, "moe.stream is off (--moe-stream=off)".into()),
        (StreamMode::Auto, Some(setting)) => return choice(true, format!("{setting} needs it")),
        (StreamMode::Auto, None) => {}
    }
    let files = match ModelFiles::open(model) {
        Ok(files) => files,
        Err(e) => return choice(false, format!("the model's header could not be read to decide ({e})")),
    };
    let shape = match ModelShape::of(&files) {
        Ok(shape) => shape,
        Err(e) => return choice(false, format!("the model's size could not be judged ({e})")),
    };
    let Some(limit) = memory.tightest() else {
        return choice(false, "the memory available is unknown here; --moe-stream streams".into());
    };
    let machine = Machine { memory: memory.clone(), disk_bytes_s: None, weights_s: None };
    let verdict = estimate(&shape, &machine, n_ctx);
    let [file, context, limit_s] = sizes([shape.file_bytes, verdict.context, limit]);
    let within = match (memory.cgroup_limit, &memory.cgroup) {
        (Some(c), Some(group)) if c == limit => format!("the {limit_s} cgroup limit ({group})"),
        _ => format!("the {limit_s} available"),
    };
    let sizes = format!("the model ({file}) and a {n_ctx}-token context ({context})");
    match verdict.mode {
        Mode::Resident => choice(false, format!("{sizes} fit in {within}; moe.stream = auto")),
        Mode::Streamed { .. } | Mode::DoesNotFit { .. } => match cannot_stream(&files) {
            Some(why) => choice(false, format!("{sizes} do not fit in {within}, but this file cannot stream: {why}")),
            None => {
                let tight = match verdict.mode {
                    Mode::DoesNotFit { need } => format!(" (even streamed it needs about {})", size(need)),
                    _ => String::new(),
                };
                choice(true, format!("{sizes} do not fit in {within}{tight}; moe.stream = auto"))
            }
        },
    }
}

/// Why the file cannot stream, when its header already says so (the checks
/// opening a streamed session makes first).
fn cannot_stream(files: &ModelFiles) -> Option<String> {
    let meta = files.meta();
    let arch = meta.get_str("general.architecture").unwrap_or_default().to_string();
    let n_expert = meta.get_u64(&format!("{arch}.expert_count")).unwrap_or(0);
    if n_expert == 0 {
        return Some(format!("{arch} has no experts"));
    }
    if let Some(why) = crate::moe::recipe::refusal(&arch) {
        return Some(why.to_string());
    }
    crate::moe::capability::check_file(files).err()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn memory(available_mib: u64, cgroup_mib: Option<u64>) -> MemoryLimits {
        MemoryLimits {
            available: Some(available_mib * MIB),
            cgroup_limit: cgroup_mib.map(|c| c * MIB),
            cgroup: cgroup_mib.map(|_| "/bmoe-test".to_string()),
        }
    }

    /// A tiny qwen3moe written once for these tests.
    fn demo() -> std::path::PathBuf {
        static MODEL: std::sync::OnceLock<(tempfile::TempDir, std::path::PathBuf)> = std::sync::OnceLock::new();
        let (_, path) = MODEL.get_or_init(|| {
            use crate::synth::{Arch, ModelSpec, Preset};
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tiny.gguf");
            let spec = ModelSpec::preset(Preset::Tiny, Arch::Qwen3Moe);
            crate::synth::write_model(&spec, &path, &mut |_, _| std::ops::ControlFlow::Continue(())).unwrap();
            (dir, path)
        });
        path.clone()
    }

    #[test]
    fn auto_streams_a_model_that_does_not_fit_and_says_why() {
        let model = demo();
        let bytes = std::fs::metadata(&model).unwrap().len();
        let roomy = choose_streaming(StreamMode::Auto, None, &model, 4096, &memory(64 * 1024, None));
        assert!(!roomy.on, "{roomy:?}");
        assert!(roomy.why.contains("fit in") && roomy.why.contains("available"), "{}", roomy.why);
        // A cgroup limit below the file: streamed, the cgroup named.
        let cap = (bytes / MIB / 2).max(1);
        let capped = choose_streaming(StreamMode::Auto, None, &model, 4096, &memory(64 * 1024, Some(cap)));
        assert!(capped.on, "{capped:?}");
        assert!(capped.why.contains("do not fit") && capped.why.contains("/bmoe-test"), "{}", capped.why);
        assert!(capped.notice().starts_with("streaming experts from disk: "), "{}", capped.notice());
    }

    #[test]
    fn on_off_and_settings_that_need_streaming_decide_before_the_size() {
        let model = demo();
        let small = memory(1, None);
        assert!(choose_streaming(StreamMode::On, None, &model, 4096, &memory(64 * 1024, None)).on);
        let off = choose_streaming(StreamMode::Off, None, &model, 4096, &small);
        assert!(!off.on && off.why.contains("off"), "{off:?}");
        let needed = choose_streaming(StreamMode::Auto, Some("moe.prefetch"), &model, 4096, &memory(64 * 1024, None));
        assert!(needed.on && needed.why.contains("moe.prefetch"), "{needed:?}");
    }

    #[test]
    fn an_unreadable_model_or_unknown_memory_stays_resident() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.gguf");
        std::fs::write(&bad, b"not a gguf").unwrap();
        let c = choose_streaming(StreamMode::Auto, None, &bad, 4096, &memory(1, None));
        assert!(!c.on && c.why.contains("header"), "{c:?}");
        let unknown = MemoryLimits::default();
        let c = choose_streaming(StreamMode::Auto, None, &demo(), 4096, &unknown);
        assert!(!c.on && c.why.contains("unknown"), "{c:?}");
    }

    #[test]
    fn a_long_context_can_tip_the_choice() {
        let model = demo();
        let bytes = std::fs::metadata(&model).unwrap().len();
        let files = ModelFiles::open(&model).unwrap();
        let shape = ModelShape::of(&files).unwrap();
        // Room for the file and a short context, not a long one.
        let limit = bytes + shape.kv_per_position * 4096 + (600 * MIB);
        let mem = MemoryLimits { available: Some(limit), cgroup_limit: None, cgroup: None };
        let short = choose_streaming(StreamMode::Auto, None, &model, 256, &mem);
        let long = choose_streaming(StreamMode::Auto, None, &model, 1 << 20, &mem);
        assert!(!short.on, "{short:?}");
        assert!(long.on, "{long:?}");
    }
}
