//! llama.cpp's grammar sampler as bmoe drives it (`src/llama/sampler.rs`):
//! the grammar stage over the whole vocabulary's candidate array, then the
//! chosen token accepted.

use std::ffi::{CStr, CString, c_char, c_void};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    unnecessary_transmutes,
    unpredictable_function_pointer_comparisons
)]
#[allow(clippy::all)]
mod sys {
    include!(env!("LLAMA_BINDINGS"));
}

/// llama.cpp's error lines, kept to explain a refused grammar.
static ERRORS: Mutex<String> = Mutex::new(String::new());

unsafe extern "C" fn log(level: sys::ggml_log_level, text: *const c_char, _: *mut c_void) {
    if level == sys::GGML_LOG_LEVEL_ERROR && !text.is_null() {
        // SAFETY: llama.cpp passes a NUL-terminated string.
        let line = unsafe { CStr::from_ptr(text) }.to_string_lossy();
        if let Ok(mut e) = ERRORS.lock() {
            e.push_str(&line);
        }
    }
}

pub struct Vocab {
    model: *mut sys::llama_model,
    vocab: *const sys::llama_vocab,
    pub n_tokens: usize,
}

impl Vocab {
    /// Loads the vocabulary-only GGUF file.
    pub fn load(path: &Path) -> Result<Vocab, String> {
        // SAFETY: plain llama.cpp calls; the path is a valid C string.
        unsafe {
            sys::llama_log_set(Some(log), std::ptr::null_mut());
            sys::llama_backend_init();
            let mut params = sys::llama_model_default_params();
            params.vocab_only = true;
            let c = CString::new(path.to_string_lossy().as_bytes()).unwrap();
            let model = sys::llama_model_load_from_file(c.as_ptr(), params);
            if model.is_null() {
                return Err(format!("llama.cpp did not load {}: {}", path.display(), take_errors()));
            }
            let vocab = sys::llama_model_get_vocab(model);
            let n_tokens = sys::llama_vocab_n_tokens(vocab) as usize;
            Ok(Vocab { model, vocab, n_tokens })
        }
    }

    /// The token's text as llama.cpp's grammar reads it.
    pub fn piece(&self, token: u32) -> Vec<u8> {
        let mut buf = vec![0u8; 256];
        // SAFETY: buf has the length passed.
        let n = unsafe {
            sys::llama_token_to_piece(self.vocab, token as i32, buf.as_mut_ptr().cast(), buf.len() as i32, 0, true)
        };
        buf.truncate(n.max(0) as usize);
        buf
    }

    /// Whether the token is a control token (its text is no text).
    pub fn is_control(&self, token: u32) -> bool {
        // SAFETY: live vocabulary.
        unsafe { sys::llama_vocab_get_attr(self.vocab, token as i32) & sys::LLAMA_TOKEN_ATTR_CONTROL != 0 }
    }

    /// The end-of-generation token the model's metadata names.
    pub fn eos(&self) -> u32 {
        // SAFETY: live vocabulary.
        unsafe { sys::llama_vocab_eos(self.vocab) as u32 }
    }

    pub fn is_eog(&self, token: u32) -> bool {
        // SAFETY: live vocabulary.
        unsafe { sys::llama_vocab_is_eog(self.vocab, token as i32) }
    }
}

impl Drop for Vocab {
    fn drop(&mut self) {
        // SAFETY: loaded once, freed once.
        unsafe { sys::llama_model_free(self.model) }
    }
}

fn take_errors() -> String {
    let mut e = ERRORS.lock().unwrap();
    let text = e.trim().replace('\n', " / ");
    e.clear();
    text
}

/// One grammar over the vocabulary.
pub struct Grammar<'v> {
    smpl: *mut sys::llama_sampler,
    vocab: &'v Vocab,
    cands: Vec<sys::llama_token_data>,
}

/// What a run of forced tokens met.
pub struct Run {
    /// Every token allowed when it came, and the end-of-turn token after.
    pub accepted: bool,
    /// Where it was refused (the token's index; the length: at the end).
    pub refused_at: Option<usize>,
    /// Seconds per step: the mask over the whole vocabulary and the token's
    /// acceptance; the last step is the mask that allows the end.
    pub step_s: Vec<f64>,
}

impl<'v> Grammar<'v> {
    /// Parses GBNF text (rule `root`); llama.cpp's error when it refuses.
    pub fn new(vocab: &'v Vocab, gbnf: &str) -> Result<Grammar<'v>, String> {
        let text = CString::new(gbnf).map_err(|_| "NUL in the grammar".to_string())?;
        take_errors();
        // SAFETY: the vocabulary outlives the sampler ('v); valid strings.
        let smpl = unsafe { sys::llama_sampler_init_grammar(vocab.vocab, text.as_ptr(), c"root".as_ptr()) };
        if smpl.is_null() {
            return Err(format!("llama.cpp refused the grammar: {}", take_errors()));
        }
        let cands = Vec::with_capacity(vocab.n_tokens);
        Ok(Grammar { smpl, vocab, cands })
    }

    /// Feeds `tokens` then asks for `eos`, as bmoe's sampler would: each
    /// step masks the whole vocabulary, checks the token was left, accepts
    /// it. Stops at the first refused token (accepting it would abort).
    pub fn run(&mut self, tokens: &[u32], eos: u32) -> Run {
        // SAFETY: a live sampler.
        unsafe { sys::llama_sampler_reset(self.smpl) };
        let mut step_s = Vec::with_capacity(tokens.len() + 1);
        for (i, &t) in tokens.iter().chain(std::iter::once(&eos)).enumerate() {
            self.refill();
            let mut arr = sys::llama_token_data_array {
                data: self.cands.as_mut_ptr(),
                size: self.cands.len(),
                selected: -1,
                sorted: false,
            };
            let start = Instant::now();
            // SAFETY: arr points into cands, alive for the call.
            unsafe { sys::llama_sampler_apply(self.smpl, &mut arr) };
            // The grammar stage masks in place and keeps the order.
            let allowed = self.cands[t as usize].logit > f32::NEG_INFINITY;
            if allowed && i < tokens.len() {
                // SAFETY: live sampler; the token was allowed.
                unsafe { sys::llama_sampler_accept(self.smpl, t as i32) };
            }
            step_s.push(start.elapsed().as_secs_f64());
            if !allowed {
                return Run { accepted: false, refused_at: Some(i), step_s };
            }
        }
        Run { accepted: true, refused_at: None, step_s }
    }

    /// Feeds `tokens` after `prefix` and says, per token, whether the
    /// grammar leaves it allowed there (nothing accepted).
    pub fn allows_after(&mut self, prefix: &[u32], tokens: &[u32]) -> Vec<bool> {
        // SAFETY: a live sampler.
        unsafe { sys::llama_sampler_reset(self.smpl) };
        for &t in prefix {
            // SAFETY: the caller's prefix is valid for the grammar.
            unsafe { sys::llama_sampler_accept(self.smpl, t as i32) };
        }
        self.refill();
        let mut arr = sys::llama_token_data_array {
            data: self.cands.as_mut_ptr(),
            size: self.cands.len(),
            selected: -1,
            sorted: false,
        };
        // SAFETY: arr points into cands, alive for the call.
        unsafe { sys::llama_sampler_apply(self.smpl, &mut arr) };
        tokens.iter().map(|&t| self.cands[t as usize].logit > f32::NEG_INFINITY).collect()
    }

    /// As [`Grammar::run`], but each step checks only the chosen token (a
    /// one-candidate array), as llama.cpp's own common sampler does before
    /// it falls back to the full mask: the cost when the model's choice is
    /// allowed.
    pub fn run_chosen_only(&mut self, tokens: &[u32], eos: u32) -> Run {
        // SAFETY: a live sampler.
        unsafe { sys::llama_sampler_reset(self.smpl) };
        let mut step_s = Vec::with_capacity(tokens.len() + 1);
        for (i, &t) in tokens.iter().chain(std::iter::once(&eos)).enumerate() {
            let mut one = [sys::llama_token_data { id: t as i32, logit: 0.0, p: 0.0 }];
            let mut arr = sys::llama_token_data_array { data: one.as_mut_ptr(), size: 1, selected: -1, sorted: false };
            let start = Instant::now();
            // SAFETY: arr points into `one`, alive for the call.
            unsafe { sys::llama_sampler_apply(self.smpl, &mut arr) };
            let allowed = one[0].logit > f32::NEG_INFINITY;
            if allowed && i < tokens.len() {
                // SAFETY: live sampler; the token was allowed.
                unsafe { sys::llama_sampler_accept(self.smpl, t as i32) };
            }
            step_s.push(start.elapsed().as_secs_f64());
            if !allowed {
                return Run { accepted: false, refused_at: Some(i), step_s };
            }
        }
        Run { accepted: true, refused_at: None, step_s }
    }

    fn refill(&mut self) {
        self.cands.clear();
        self.cands.extend((0..self.vocab.n_tokens as i32).map(|id| sys::llama_token_data { id, logit: 0.0, p: 0.0 }));
    }
}

impl Drop for Grammar<'_> {
    fn drop(&mut self) {
        // SAFETY: created once, freed once.
        unsafe { sys::llama_sampler_free(self.smpl) }
    }
}
