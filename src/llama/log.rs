//! llama.cpp's log: quiet by default (warnings and errors only), everything
//! with `--verbose`; the latest errors are kept to explain a failed load.

use std::collections::VecDeque;
use std::ffi::{CStr, c_char, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use llama_cpp_sys_2 as sys;

static VERBOSE: AtomicBool = AtomicBool::new(false);
static RECENT: Mutex<VecDeque<String>> = Mutex::new(VecDeque::new());
const KEEP: usize = 8;

/// Shows llama.cpp's informational log on stderr.
pub fn set_verbose(on: bool) {
    VERBOSE.store(on, Ordering::Relaxed);
}

/// The latest warnings and errors llama.cpp logged, oldest first.
pub fn last_errors() -> Vec<String> {
    RECENT.lock().map(|r| r.iter().cloned().collect()).unwrap_or_default()
}

pub(super) fn install() {
    // SAFETY: the callback is a plain function valid for the whole process
    // and ignores its user data.
    unsafe { sys::llama_log_set(Some(on_log), std::ptr::null_mut()) };
}

unsafe extern "C" fn on_log(level: sys::ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a valid NUL-terminated string for the call.
    let line = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let important = level == sys::GGML_LOG_LEVEL_WARN || level == sys::GGML_LOG_LEVEL_ERROR;
    if important && let Ok(mut recent) = RECENT.lock() {
        if recent.len() == KEEP {
            recent.pop_front();
        }
        recent.push_back(line.trim().to_string());
    }
    if VERBOSE.load(Ordering::Relaxed) {
        eprint!("{line}");
    }
}
