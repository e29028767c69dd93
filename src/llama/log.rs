//! llama.cpp's log: quiet by default (warnings and errors only), everything
//! with `--verbose`; the latest errors are kept to explain a failed load.

use std::collections::VecDeque;
use std::ffi::{CStr, c_char, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use llama_cpp_sys_2 as sys;

static VERBOSE: AtomicBool = AtomicBool::new(false);
/// The latest errors and, apart, the latest warnings: a load that logs
/// dozens of warnings before its one error still has the error.
static RECENT: Mutex<Recent> = Mutex::new(Recent { errors: VecDeque::new(), warnings: VecDeque::new() });
const KEEP: usize = 8;

/// The last `KEEP` lines of each level.
struct Recent {
    errors: VecDeque<String>,
    warnings: VecDeque<String>,
}

impl Recent {
    fn push(&mut self, error: bool, line: String) {
        let lines = if error { &mut self.errors } else { &mut self.warnings };
        if lines.len() == KEEP {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// The errors (oldest first), then the warnings.
    fn lines(&self) -> Vec<String> {
        self.errors.iter().chain(&self.warnings).cloned().collect()
    }

    /// The latest error, or the latest warning if none.
    fn latest(&self) -> Option<String> {
        self.errors.back().or(self.warnings.back()).cloned()
    }
}

/// Bytes of the KV caches (and recurrent state) llama.cpp said it
/// allocated since [`take_kv_cache_bytes`] last read them.
static KV_BYTES: AtomicU64 = AtomicU64::new(0);

/// The bytes of keys, values and recurrent state llama.cpp allocated for
/// the contexts created since the last call (its `size = X MiB` lines),
/// and starts counting again.
pub fn take_kv_cache_bytes() -> u64 {
    KV_BYTES.swap(0, Ordering::Relaxed)
}

/// The MiB of a `llama_kv_cache: size = X MiB (...)` line (also the
/// recurrent memory's), in bytes.
fn cache_size(line: &str) -> Option<u64> {
    let (name, rest) = line.split_once(": size = ")?;
    if !(name.contains("kv_cache") || name.contains("memory_recurrent")) {
        return None;
    }
    let mut words = rest.split_whitespace();
    let mib: f64 = words.next()?.parse().ok()?;
    words.next().filter(|u| *u == "MiB")?;
    Some((mib * 1048576.0) as u64)
}

/// Shows llama.cpp's informational log on stderr.
pub fn set_verbose(on: bool) {
    VERBOSE.store(on, Ordering::Relaxed);
}

/// The latest errors llama.cpp logged (oldest first), then its latest
/// warnings: the reason for a refusal comes before what it warned about.
pub fn last_errors() -> Vec<String> {
    RECENT.lock().map(|r| r.lines()).unwrap_or_default()
}

/// The latest error llama.cpp logged, or its latest warning if none.
pub fn last_error() -> Option<String> {
    RECENT.lock().ok()?.latest()
}

/// Forgets the lines kept so far (before an operation whose failure they explain).
pub fn clear_recent() {
    if let Ok(mut recent) = RECENT.lock() {
        recent.errors.clear();
        recent.warnings.clear();
    }
}

pub(super) fn install() {
    // SAFETY: the callback is a plain function valid for the whole process
    // and ignores its user data.
    unsafe { sys::llama_log_set(Some(on_log), std::ptr::null_mut()) };
}

/// The most characters of a log line kept for an error message.
const MAX_LINE: usize = 300;

unsafe extern "C" fn on_log(level: sys::ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a valid NUL-terminated string for the call.
    let line = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    if let Some(bytes) = cache_size(&line) {
        KV_BYTES.fetch_add(bytes, Ordering::Relaxed);
    }
    let important = level == sys::GGML_LOG_LEVEL_WARN || level == sys::GGML_LOG_LEVEL_ERROR;
    if important && let Ok(mut recent) = RECENT.lock() {
        // A line quoting the file (an architecture name, a token) is kept
        // short and printable: the file may hold anything.
        recent.push(level == sys::GGML_LOG_LEVEL_ERROR, crate::text::excerpt(line.trim(), MAX_LINE));
    }
    if VERBOSE.load(Ordering::Relaxed) {
        eprint!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kv_cache_size_is_read_from_its_log_line() {
        let line = "llama_kv_cache: size = 1536.00 MiB ( 32768 cells,  48 layers,  4/4 seqs), K (f16):  768.00 MiB";
        assert_eq!(cache_size(line), Some(1536 << 20));
        assert_eq!(cache_size("llama_memory_recurrent: size =    0.50 MiB (  1 cells)"), Some(1 << 19));
        assert_eq!(cache_size("llama_context: size = 12.00 MiB"), None);
        assert_eq!(cache_size("llama_kv_cache: size = lots"), None);
    }

    /// Errors come first however many warnings came before and after them,
    /// and each level keeps its own latest lines.
    #[test]
    fn errors_come_before_the_warnings_around_them() {
        let mut recent = Recent { errors: VecDeque::new(), warnings: VecDeque::new() };
        for i in 0..20 {
            recent.push(false, format!("model has unused tensor {i} -- ignoring"));
        }
        recent.push(true, "missing tensor 'blk.0.attn_q.weight'".into());
        recent.push(false, "one more warning".into());
        let lines = recent.lines();
        assert_eq!(lines[0], "missing tensor 'blk.0.attn_q.weight'");
        assert_eq!(lines.len(), 1 + KEEP);
        assert_eq!(lines[1], "model has unused tensor 13 -- ignoring");
        assert_eq!(lines.last().unwrap(), "one more warning");
        assert_eq!(recent.latest().as_deref(), Some("missing tensor 'blk.0.attn_q.weight'"));
    }
}
