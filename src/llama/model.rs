//! A loaded llama.cpp model and its vocabulary.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use super::rpc::RemoteLayers;

/// The most characters of llama.cpp's log a failed load's error quotes.
const MAX_REASON: usize = 600;

/// Why llama.cpp refused a model.
#[derive(Debug, thiserror::Error)]
#[error("llama.cpp could not load {path}: {reason}")]
pub struct ModelLoadError {
    /// The file.
    pub path: PathBuf,
    /// llama.cpp's last error lines, or our own reason.
    pub reason: String,
}

/// A model loaded the way streaming needs it: memory-mapped, every layer on
/// the CPU, no lazy tensors, no repacking into extra buffer types except
/// for the expert banks a resident run asks to repack (a streamed run
/// repacks its experts itself as they are read: [`super::Repacker`]).
pub struct Model {
    ptr: NonNull<sys::llama_model>,
    vocab: *const sys::llama_vocab,
    path: PathBuf,
    /// The RPC servers holding layers, by the address each answered on.
    remote: Vec<std::net::SocketAddr>,
    /// The special tokens' texts, longest first (made on first use).
    specials: std::sync::OnceLock<Vec<(Vec<u8>, i32)>>,
    /// The vocabulary as llguidance reads it (made on first use).
    token_table: std::sync::OnceLock<Result<super::TokenTable, String>>,
}

// SAFETY: llama_model is immutable after load except for the expert data
// pointers bmoe rebinds, which only the owning session's eval thread touches.
unsafe impl Send for Model {}
// SAFETY: see Send; shared use is read-only (tokenize, metadata).
unsafe impl Sync for Model {}

impl Model {
    /// Loads `path` (the first shard of a split set loads them all).
    /// `int_overrides` replace integer metadata, e.g. `qwen3moe.expert_used_count`.
    /// Tensors whose names match one of `repack` (regular expressions) are
    /// loaded into the CPU backend's repacking buffer type: give only
    /// tensors [`super::Repacker::new`] accepts. Tensors matching one of
    /// `invariant` are loaded into the invariant-sgemm buffer type (give only
    /// names from [`super::invariant_sgemm::invariant_weights`], and only where
    /// [`super::invariant_sgemm::available`]). With `mtp`, the model's
    /// next-token-prediction layers are loaded too (for an MTP context).
    /// `remote` places the last layers on RPC servers (none when empty).
    pub fn load(
        path: &Path,
        int_overrides: &[(String, i64)],
        repack: &[String],
        invariant: &[String],
        mtp: bool,
        remote: &RemoteLayers,
    ) -> Result<Model, ModelLoadError> {
        super::init();
        let fail = |reason: String| ModelLoadError { path: path.to_path_buf(), reason };
        let cpath =
            CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| fail("path contains a NUL byte".into()))?;
        let mut overrides = Vec::with_capacity(int_overrides.len() + 1);
        for (key, value) in int_overrides {
            // SAFETY: an all-zero override is a valid (terminator) value of this plain C struct.
            let mut o: sys::llama_model_kv_override = unsafe { std::mem::zeroed() };
            if key.len() >= o.key.len() {
                return Err(fail(format!("override key {key} is too long")));
            }
            for (dst, src) in o.key.iter_mut().zip(key.bytes()) {
                *dst = src as std::ffi::c_char;
            }
            o.tag = sys::LLAMA_KV_OVERRIDE_TYPE_INT;
            o.__bindgen_anon_1.val_i64 = *value;
            overrides.push(o);
        }
        // SAFETY: the zeroed terminator entry (empty key) ends the list.
        overrides.push(unsafe { std::mem::zeroed() });

        // SAFETY: returns a plain struct of defaults.
        let mut params = unsafe { sys::llama_model_default_params() };
        params.n_gpu_layers = 0;
        params.load_mode = sys::LLAMA_LOAD_MODE_MMAP;
        params.lazy_mode = sys::LLAMA_LAZY_MODE_OFF;
        params.use_extra_bufts = false;
        params.load_mtp = mtp;
        // Kept alive until the load returns: llama.cpp copies the device list.
        let (mut devices, split, offloaded) = remote.params();
        if offloaded > 0 {
            params.devices = devices.as_mut_ptr();
            params.tensor_split = split.as_ptr();
            params.n_gpu_layers = offloaded;
            params.split_mode = sys::LLAMA_SPLIT_MODE_LAYER;
        }
        if !int_overrides.is_empty() {
            params.kv_overrides = overrides.as_ptr();
        }
        let cstrings = |list: &[String], what: &str| {
            list.iter()
                .map(|p| {
                    CString::new(p.as_str()).map_err(|_| fail(format!("{what} pattern {p:?} contains a NUL byte")))
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let patterns = cstrings(repack, "repack")?;
        let invariant_patterns = cstrings(invariant, "invariant-sgemm")?;
        let mut buft_overrides = Vec::with_capacity(patterns.len() + invariant_patterns.len() + 1);
        if !patterns.is_empty() {
            let buft = super::repack::repack_buffer_type()
                .ok_or_else(|| fail("this CPU backend has no repacking buffer type".into()))?;
            for p in &patterns {
                buft_overrides.push(sys::llama_model_tensor_buft_override { pattern: p.as_ptr(), buft });
            }
        }
        if !invariant_patterns.is_empty() {
            let buft = super::invariant_sgemm::buffer_type()
                .ok_or_else(|| fail("this build has no invariant-sgemm buffer type".into()))?;
            for p in &invariant_patterns {
                buft_overrides.push(sys::llama_model_tensor_buft_override { pattern: p.as_ptr(), buft });
            }
        }
        if !buft_overrides.is_empty() {
            buft_overrides
                .push(sys::llama_model_tensor_buft_override { pattern: std::ptr::null(), buft: std::ptr::null_mut() });
            params.tensor_buft_overrides = buft_overrides.as_ptr();
        }
        // What llama.cpp logs from here explains a failed load.
        super::log::clear_recent();
        // SAFETY: cpath, overrides, patterns, invariant_patterns, buft_overrides, devices and split outlive the call;
        // llama.cpp copies what it keeps.
        let raw = unsafe { sys::llama_model_load_from_file(cpath.as_ptr(), params) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            let errors = super::last_errors();
            // One readable line however much llama.cpp quoted from the file.
            fail(if errors.is_empty() {
                "unknown error (run with --verbose)".into()
            } else {
                crate::text::excerpt(&errors.join("; "), MAX_REASON)
            })
        })?;
        // SAFETY: a loaded model always has a vocabulary, valid as long as the model.
        let vocab = unsafe { sys::llama_model_get_vocab(ptr.as_ptr()) };
        let remote = remote.holding().map(|(d, _)| d.addr).collect();
        Ok(Model {
            ptr,
            vocab,
            path: path.to_path_buf(),
            remote,
            specials: std::sync::OnceLock::new(),
            token_table: std::sync::OnceLock::new(),
        })
    }

    /// Whether some of the model's layers live on RPC servers.
    pub fn has_remote_layers(&self) -> bool {
        !self.remote.is_empty()
    }

    /// True when an RPC server holding some of the layers has gone: ggml
    /// would end the process at the next message to it, freeing the
    /// layers' buffers included.
    pub fn remote_lost(&self) -> bool {
        self.remote.iter().any(|&addr| super::rpc::connection_lost(addr))
    }

    pub(super) fn raw(&self) -> *mut sys::llama_model {
        self.ptr.as_ptr()
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The vocabulary, for llama.cpp calls in this module.
    pub(super) fn vocab_ptr(&self) -> *const sys::llama_vocab {
        self.vocab
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        // SAFETY: vocab is valid for the model's lifetime.
        unsafe { sys::llama_vocab_n_tokens(self.vocab) as usize }
    }

    /// Number of transformer layers (the MTP layers not counted).
    pub fn n_layer(&self) -> u32 {
        // SAFETY: plain getter on a live model.
        unsafe { sys::llama_model_n_layer(self.raw()) as u32 }
    }

    /// Number of next-token-prediction (MTP) layers after the trunk.
    pub fn n_layer_mtp(&self) -> u32 {
        // SAFETY: plain getter on a live model.
        unsafe { sys::llama_model_n_layer_nextn(self.raw()).max(0) as u32 }
    }

    /// Whether some layers keep a recurrent state (which cannot drop a
    /// tail of positions the way a KV cache can).
    pub fn has_recurrent_state(&self) -> bool {
        // SAFETY: plain getters on a live model.
        unsafe { sys::llama_model_is_recurrent(self.raw()) || sys::llama_model_is_hybrid(self.raw()) }
    }

    /// Tokenizes `text`, adding BOS (per the model's vocabulary) when
    /// `add_special`; special-token markers in it are read as tokens.
    pub fn tokenize(&self, text: &str, add_special: bool) -> Vec<i32> {
        self.tokenize_with(text, add_special, true)
    }

    /// Puts the BOS token in front of `tokens` where the vocabulary wants
    /// one and they do not begin with it already (no doubled BOS).
    pub fn add_bos_once(&self, tokens: &mut Vec<i32>) {
        if let Some(bos) = self.bos().filter(|_| self.adds_bos())
            && tokens.first() != Some(&bos)
        {
            tokens.insert(0, bos);
        }
    }

    /// Tokenizes a rendered prompt: special tokens read, and BOS added
    /// only where the vocabulary wants one and the text did not already
    /// write it (no doubled BOS).
    pub fn tokenize_rendered(&self, text: &str) -> Vec<i32> {
        let mut tokens = self.tokenize(text, false);
        self.add_bos_once(&mut tokens);
        tokens
    }

    /// Tokenizes `text` as plain text: special-token markers in it stay
    /// text (no BOS added).
    pub fn tokenize_plain(&self, text: &str) -> Vec<i32> {
        self.tokenize_with(text, false, false)
    }

    fn tokenize_with(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<i32> {
        let mut out = vec![0i32; text.len() + 8];
        loop {
            // SAFETY: text is valid for text.len() bytes; out has out.len() slots.
            let n = unsafe {
                sys::llama_tokenize(
                    self.vocab,
                    text.as_ptr().cast(),
                    text.len() as i32,
                    out.as_mut_ptr(),
                    out.len() as i32,
                    add_special,
                    parse_special,
                )
            };
            if n >= 0 {
                out.truncate(n as usize);
                return out;
            }
            out.resize((-n) as usize, 0);
        }
    }

    /// The texts of the vocabulary's control tokens (those a text names
    /// only when special tokens are read: llama.cpp matches user-defined
    /// tokens in plain text too) with their ids, longest first.
    pub fn control_texts(&self) -> &[(Vec<u8>, i32)] {
        self.specials.get_or_init(|| {
            let mut out: Vec<(Vec<u8>, i32)> = (0..self.n_vocab() as i32)
                .filter(|&t| {
                    // SAFETY: a token id below the vocabulary's size.
                    let attr = unsafe { sys::llama_vocab_get_attr(self.vocab, t) };
                    attr & sys::LLAMA_TOKEN_ATTR_CONTROL != 0
                })
                .map(|t| (self.token_bytes(t), t))
                .filter(|(text, _)| !text.is_empty())
                .collect();
            out.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
            out
        })
    }

    /// The bytes a token stands for (special tokens rendered as text).
    pub fn token_bytes(&self, token: i32) -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        loop {
            // SAFETY: buf has buf.len() writable bytes.
            let n = unsafe {
                sys::llama_token_to_piece(self.vocab, token, buf.as_mut_ptr().cast(), buf.len() as i32, 0, true)
            };
            if n >= 0 {
                buf.truncate(n as usize);
                return buf;
            }
            buf.resize((-n) as usize, 0);
        }
    }

    /// The vocabulary as llguidance reads it, for JSON-schema constrained
    /// output: control tokens marked special, every end-of-generation token
    /// an end. Built on first use (about 0.4 s for 150,000 tokens).
    pub fn token_table(&self) -> Result<&super::TokenTable, String> {
        let table = self.token_table.get_or_init(|| {
            let n = self.n_vocab() as i32;
            let words: Vec<Vec<u8>> = (0..n)
                .map(|t| {
                    // SAFETY: a token id below the vocabulary's size.
                    let attr = unsafe { sys::llama_vocab_get_attr(self.vocab, t) };
                    let text = self.token_bytes(t);
                    if attr & sys::LLAMA_TOKEN_ATTR_CONTROL != 0 {
                        [&[toktrie::TokTrie::SPECIAL_TOKEN_MARKER][..], &text].concat()
                    } else {
                        text
                    }
                })
                .collect();
            let ends: Vec<u32> = (0..n).filter(|&t| self.is_eog(t)).map(|t| t as u32).collect();
            super::TokenTable::new(&words, &ends)
        });
        table.as_ref().map_err(Clone::clone)
    }

    /// The BOS token, if the vocabulary has one.
    pub fn bos(&self) -> Option<i32> {
        // SAFETY: plain getter on a live vocabulary.
        let t = unsafe { sys::llama_vocab_bos(self.vocab) };
        (t >= 0).then_some(t)
    }

    /// The EOS token, if the vocabulary has one.
    pub fn eos(&self) -> Option<i32> {
        // SAFETY: plain getter on a live vocabulary.
        let t = unsafe { sys::llama_vocab_eos(self.vocab) };
        (t >= 0).then_some(t)
    }

    /// Whether the vocabulary wants BOS at the start of a sequence.
    pub fn adds_bos(&self) -> bool {
        // SAFETY: plain getter on a live vocabulary.
        unsafe { sys::llama_vocab_get_add_bos(self.vocab) }
    }

    /// True for end-of-generation tokens.
    pub fn is_eog(&self, token: i32) -> bool {
        // SAFETY: plain lookup on a live vocabulary.
        unsafe { sys::llama_vocab_is_eog(self.vocab, token) }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // A model whose server has gone is left in memory: freeing its
        // remote buffers would message the server, and ggml ends the
        // process when that fails.
        if self.remote_lost() {
            return;
        }
        // SAFETY: every context created from this model holds an Arc to it,
        // so none is alive when the last reference drops.
        unsafe { sys::llama_model_free(self.ptr.as_ptr()) };
    }
}
