//! Token selection: greedy argmax (bmoe's own, ties to the lowest id) or
//! llama.cpp's top-k -> top-p -> temperature -> seeded draw chain, either
//! one behind a [`Constraint`]: a GBNF grammar or a JSON schema.

use std::ffi::CString;
use std::marker::PhantomData;
use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use super::{Constraint, Model, SchemaGuide};

/// Sampling settings; `temp <= 0` means greedy.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// Temperature; 0 or less selects greedy argmax.
    pub temp: f32,
    /// Keep the k most likely tokens (0 disables the stage).
    pub top_k: i32,
    /// Keep the smallest set of tokens whose probability reaches p.
    pub top_p: f32,
    /// Drop the tokens less likely than this fraction of the most likely
    /// one (0 disables the stage).
    pub min_p: f32,
    /// Locally typical sampling's probability mass (1 disables the stage).
    pub typical_p: f32,
    /// Seed of the random draw.
    pub seed: u32,
    /// Penalties on the tokens generated lately (greedy too).
    pub penalties: Penalties,
    /// Added to a token's logit before anything else, by token id (greedy
    /// too): `-inf` bans a token, a large bias forces it.
    pub logit_bias: Vec<(i32, f32)>,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling {
            temp: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.0,
            typical_p: 1.0,
            seed: 0,
            penalties: Penalties::default(),
            logit_bias: Vec::new(),
        }
    }
}

impl Sampling {
    /// Whether the logits are changed before a choice (penalties or a
    /// bias): a greedy choice is then no longer the model's argmax.
    pub fn reshapes_logits(&self) -> bool {
        self.penalties.active() || !self.logit_bias.is_empty()
    }
}

/// llama.cpp's repetition penalties over a window of generated tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalties {
    /// How many of the last generated tokens count (0 disables them).
    pub last_n: i32,
    /// Divides a counted token's positive logit (multiplies a negative
    /// one); 1 disables it.
    pub repeat: f32,
    /// Subtracted once per time a token was generated in the window.
    pub frequency: f32,
    /// Subtracted once from a token generated in the window.
    pub presence: f32,
}

impl Default for Penalties {
    fn default() -> Penalties {
        Penalties { last_n: 64, repeat: 1.0, frequency: 0.0, presence: 0.0 }
    }
}

impl Penalties {
    /// Whether any penalty applies.
    pub fn active(&self) -> bool {
        self.last_n != 0 && (self.repeat != 1.0 || self.frequency != 0.0 || self.presence != 0.0)
    }
}

/// A sampler built from [`Sampling`], optionally behind a constraint that
/// masks every token it does not allow: a GBNF grammar (llama.cpp's
/// grammar sampler, the chain's first stage) or a JSON schema (llguidance).
pub struct Sampler<'m> {
    chain: Option<NonNull<sys::llama_sampler>>,
    /// The chain's grammar stage, owned by the chain.
    grammar: Option<NonNull<sys::llama_sampler>>,
    /// The JSON schema's matcher.
    schema: Option<SchemaGuide>,
    /// Greedy choice (argmax over the logits the constraint left), not a draw.
    greedy: bool,
    /// The chain changes logits (a bias, penalties) before the choice.
    reshaped: bool,
    scratch: Vec<sys::llama_token_data>,
    /// The logits a schema masked.
    masked: Vec<f32>,
    /// Why the last [`Sampler::sample`] chose nothing, when the schema's
    /// matcher failed (not a complete text).
    failure: Option<String>,
    /// The grammar stage reads the model's vocabulary.
    _model: PhantomData<&'m Model>,
}

// SAFETY: the chain is owned and used by one thread at a time (&mut self).
unsafe impl Send for Sampler<'_> {}

impl Sampler<'static> {
    /// Builds the sampler (for a vocabulary of `n_vocab` tokens, which
    /// llama.cpp's penalty and bias stages are told).
    pub fn new(s: &Sampling, n_vocab: usize) -> Sampler<'static> {
        let mut sampler = Sampler::bare(s.temp <= 0.0);
        if !sampler.greedy || s.reshapes_logits() {
            sampler.chain = new_chain();
            sampler.add_shaping_stages(s, n_vocab);
        }
        if !sampler.greedy {
            sampler.add_draw_stages(s);
        }
        sampler
    }
}

/// A new, empty sampler chain.
fn new_chain() -> Option<NonNull<sys::llama_sampler>> {
    super::init();
    // SAFETY: a new chain, owned by the caller.
    NonNull::new(unsafe { sys::llama_sampler_chain_init(sys::llama_sampler_chain_params { no_perf: true }) })
}

impl<'m> Sampler<'m> {
    /// A sampler without a chain or a constraint.
    fn bare(greedy: bool) -> Sampler<'m> {
        Sampler {
            chain: None,
            grammar: None,
            schema: None,
            greedy,
            reshaped: false,
            scratch: Vec::new(),
            masked: Vec::new(),
            failure: None,
            _model: PhantomData,
        }
    }

    /// Builds the sampler behind `constraint` (none: [`Sampler::new`]).
    pub fn constrained(s: &Sampling, model: &'m Model, constraint: Option<&Constraint>) -> Result<Sampler<'m>, String> {
        match constraint {
            None => Ok(Sampler::new(s, model.n_vocab())),
            Some(Constraint::Grammar(grammar)) => Sampler::with_grammar(s, model, grammar),
            Some(Constraint::JsonSchema(schema)) => {
                let guide = SchemaGuide::new(model.token_table()?, schema)?;
                let mut sampler = Sampler::new(s, model.n_vocab());
                sampler.schema = Some(guide);
                Ok(sampler)
            }
        }
    }

    /// Builds the sampler behind `grammar` (GBNF text, rule `root` first)
    /// for `model`'s vocabulary; an error quotes llama.cpp's parse error.
    pub fn with_grammar(s: &Sampling, model: &'m Model, grammar: &str) -> Result<Sampler<'m>, String> {
        super::init();
        let text = CString::new(grammar).map_err(|_| "the grammar contains a NUL byte".to_string())?;
        // llama.cpp prints a grammar's parse error straight to stderr: it is
        // caught there and becomes the error's text.
        let (stage, printed) = with_stderr_captured(|| {
            // SAFETY: the vocabulary lives as long as the model, which outlives
            // the sampler ('m); the strings are valid for the call.
            unsafe { sys::llama_sampler_init_grammar(model.vocab_ptr(), text.as_ptr(), c"root".as_ptr()) }
        });
        if stage.is_null() {
            let why = printed.lines().find_map(|l| l.split_once("error parsing grammar: ").map(|(_, e)| e.trim()));
            let why = why.map(str::to_string).or_else(super::log::last_error);
            return Err(format!("the grammar was refused: {}", why.unwrap_or_else(|| "it does not parse".into())));
        }
        let mut sampler = Sampler::bare(s.temp <= 0.0);
        sampler.chain = new_chain();
        sampler.grammar = NonNull::new(stage);
        if let Some(chain) = sampler.chain {
            // SAFETY: the live chain takes ownership of the grammar stage.
            unsafe { sys::llama_sampler_chain_add(chain.as_ptr(), stage) };
        }
        sampler.add_shaping_stages(s, model.n_vocab());
        if !sampler.greedy {
            sampler.add_draw_stages(s);
        }
        Ok(sampler)
    }

    /// Appends the logit bias and the penalties to the chain (where set):
    /// stages that change logits in place and keep their order, so a
    /// greedy choice is the argmax of what they leave.
    fn add_shaping_stages(&mut self, s: &Sampling, n_vocab: usize) {
        let Some(chain) = self.chain else { return };
        self.reshaped = s.reshapes_logits();
        let n_vocab = i32::try_from(n_vocab).unwrap_or(i32::MAX);
        let bias: Vec<sys::llama_logit_bias> =
            s.logit_bias.iter().map(|&(token, bias)| sys::llama_logit_bias { token, bias }).collect();
        let p = s.penalties;
        // SAFETY: the live chain takes ownership of each new stage; the
        // bias list is copied by llama.cpp during the call.
        unsafe {
            let chain = chain.as_ptr();
            if !bias.is_empty() {
                let n = i32::try_from(bias.len()).unwrap_or(i32::MAX);
                sys::llama_sampler_chain_add(chain, sys::llama_sampler_init_logit_bias(n_vocab, n, bias.as_ptr()));
            }
            if p.active() {
                let stage = sys::llama_sampler_init_penalties(n_vocab, p.last_n, p.repeat, p.frequency, p.presence);
                sys::llama_sampler_chain_add(chain, stage);
            }
        }
    }

    /// Appends top-k, typical, top-p, min-p, temperature and the seeded
    /// draw to the chain (llama.cpp's order).
    fn add_draw_stages(&mut self, s: &Sampling) {
        let Some(chain) = self.chain else { return };
        // SAFETY: the live chain takes ownership of each new stage.
        unsafe {
            let chain = chain.as_ptr();
            if s.top_k > 0 {
                sys::llama_sampler_chain_add(chain, sys::llama_sampler_init_top_k(s.top_k));
            }
            if s.typical_p < 1.0 {
                sys::llama_sampler_chain_add(chain, sys::llama_sampler_init_typical(s.typical_p, 1));
            }
            sys::llama_sampler_chain_add(chain, sys::llama_sampler_init_top_p(s.top_p, 1));
            if s.min_p > 0.0 {
                sys::llama_sampler_chain_add(chain, sys::llama_sampler_init_min_p(s.min_p, 1));
            }
            sys::llama_sampler_chain_add(chain, sys::llama_sampler_init_temp(s.temp));
            sys::llama_sampler_chain_add(chain, sys::llama_sampler_init_dist(s.seed));
        }
    }

    /// Picks the next token from `logits`: greedy argmax (lowest id on
    /// ties) over what the constraint allows, or the chain's draw. `None`
    /// when the constraint allows no token at all (it ended and the
    /// vocabulary has no end-of-generation token it accepts), or its
    /// matcher failed ([`Sampler::failure`] says why): nothing is accepted
    /// then.
    pub fn sample(&mut self, logits: &[f32]) -> Option<i32> {
        if self.schema.is_some() {
            return self.sample_schema(logits);
        }
        if self.greedy
            && !self.reshaped
            && let Some(token) = self.greedy_grammar_fast(logits)
        {
            return Some(token);
        }
        self.draw(logits)
    }

    /// The same sampler, with a grammar checked against the whole
    /// vocabulary every step even where the greedy choice's own check would
    /// do (the shortcut's reference, for tests and comparisons).
    pub fn without_shortcut(mut self) -> Sampler<'m> {
        self.grammar = None;
        self
    }

    /// Why the last [`Sampler::sample`] chose nothing, when it was not
    /// because the constraint was complete.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Greedy under a grammar: the unconstrained argmax when the grammar
    /// allows it (the same token the masked argmax picks, ties included),
    /// checked on that one token instead of the whole vocabulary.
    fn greedy_grammar_fast(&mut self, logits: &[f32]) -> Option<i32> {
        let (chain, stage) = (self.chain?, self.grammar?);
        let best = argmax(logits);
        let mut one = [sys::llama_token_data { id: best, logit: *logits.get(best as usize)?, p: 0.0 }];
        let mut arr = sys::llama_token_data_array { data: one.as_mut_ptr(), size: 1, selected: -1, sorted: false };
        // SAFETY: arr points into `one`, alive for the call; the stage is
        // alive as long as its chain. Applying only masks, it keeps no state.
        unsafe { sys::llama_sampler_apply(stage.as_ptr(), &mut arr) };
        if one[0].logit == f32::NEG_INFINITY {
            return None;
        }
        // SAFETY: live chain.
        unsafe { sys::llama_sampler_accept(chain.as_ptr(), best) };
        Some(best)
    }

    /// Under a JSON schema: the logits masked, then the greedy choice or
    /// the chain's draw over them.
    fn sample_schema(&mut self, logits: &[f32]) -> Option<i32> {
        let guide = self.schema.as_mut()?;
        let mut masked = std::mem::take(&mut self.masked);
        masked.clear();
        masked.extend_from_slice(logits);
        let token = match guide.mask(&mut masked) {
            Ok(()) => self.draw(&masked),
            Err(e) => {
                self.failure = Some(e);
                None
            }
        };
        self.masked = masked;
        let token = token.filter(|&t| self.masked.get(t as usize).is_some_and(|&l| l > f32::NEG_INFINITY))?;
        let guide = self.schema.as_mut()?;
        if let Err(e) = guide.accept(token as u32) {
            self.failure = Some(e);
            return None;
        }
        Some(token)
    }

    /// The greedy argmax (no chain), or the chain's choice: its grammar
    /// stage masks, its draw stages draw.
    fn draw(&mut self, logits: &[f32]) -> Option<i32> {
        let Some(chain) = self.chain else { return Some(argmax(logits)) };
        self.scratch.clear();
        self.scratch.extend(logits.iter().enumerate().map(|(i, &logit)| sys::llama_token_data {
            id: i as i32,
            logit,
            p: 0.0,
        }));
        let mut arr = sys::llama_token_data_array {
            data: self.scratch.as_mut_ptr(),
            size: self.scratch.len(),
            selected: -1,
            sorted: false,
        };
        // SAFETY: arr points into scratch, alive for the call; the chain is live.
        unsafe {
            sys::llama_sampler_apply(chain.as_ptr(), &mut arr);
        }
        // The grammar stage only masks (sets logits to -inf) and keeps the order.
        let chosen = if self.greedy {
            let masked: Vec<f32> = self.scratch[..arr.size].iter().map(|d| d.logit).collect();
            self.scratch.get(argmax(&masked) as usize)
        } else {
            usize::try_from(arr.selected).ok().and_then(|i| self.scratch.get(i))
        };
        // A masked token must never reach the grammar: accepting one aborts.
        let token = chosen.filter(|d| d.logit > f32::NEG_INFINITY)?.id;
        // SAFETY: live chain.
        unsafe { sys::llama_sampler_accept(chain.as_ptr(), token) };
        Some(token)
    }

    /// Restarts the random stream from the seed (and the grammar from its
    /// start).
    pub fn reset(&mut self) {
        self.failure = None;
        if let Some(schema) = &mut self.schema {
            schema.reset();
        }
        if let Some(chain) = self.chain {
            // SAFETY: live chain.
            unsafe { sys::llama_sampler_reset(chain.as_ptr()) };
        }
    }
}

impl Drop for Sampler<'_> {
    fn drop(&mut self) {
        if let Some(chain) = self.chain {
            // SAFETY: the chain owns its stages and is freed once.
            unsafe { sys::llama_sampler_free(chain.as_ptr()) };
        }
    }
}

/// Runs `f` with the process's stderr sent to a temporary file, and returns
/// what was written there. Other threads' writes in that moment land there
/// too; it is used only around a call known to print (a grammar's parse).
fn with_stderr_captured<T>(f: impl FnOnce() -> T) -> (T, String) {
    // SAFETY: plain descriptor calls; stderr (2) is restored before returning,
    // and the temporary file is closed once read.
    unsafe {
        let tmp = libc::tmpfile();
        let saved = libc::dup(2);
        if tmp.is_null() || saved < 0 {
            if !tmp.is_null() {
                libc::fclose(tmp);
            }
            return (f(), String::new());
        }
        let fd = libc::fileno(tmp);
        libc::dup2(fd, 2);
        let out = f();
        libc::dup2(saved, 2);
        libc::close(saved);
        let mut text = Vec::new();
        let mut buf = [0u8; 4096];
        libc::lseek(fd, 0, libc::SEEK_SET);
        loop {
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            if n <= 0 {
                break;
            }
            text.extend_from_slice(&buf[..n as usize]);
        }
        libc::fclose(tmp);
        (out, String::from_utf8_lossy(&text).into_owned())
    }
}

/// Index of the largest logit; the lowest index wins ties.
pub fn argmax(logits: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_ties_go_low() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    }

    #[test]
    fn seeded_sampling_repeats() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let s = Sampling { temp: 1.0, seed: 9, ..Sampling::default() };
        let run = || {
            let mut sm = Sampler::new(&s, logits.len());
            (0..20).map(|_| sm.sample(&logits).unwrap()).collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        assert!(a.iter().any(|&t| t != a[0]), "a temperature draw should vary");
    }

    /// Logits whose argmax is token 6, with 13, 20... tied behind it.
    fn periodic() -> Vec<f32> {
        (0..50).map(|i| (i % 7) as f32 * 0.3).collect()
    }

    fn picks(s: &Sampling, logits: &[f32], n: usize) -> Vec<i32> {
        let mut sampler = Sampler::new(s, logits.len());
        (0..n).map(|_| sampler.sample(logits).unwrap()).collect()
    }

    #[test]
    fn a_logit_bias_forces_or_bans_a_token() {
        let logits = periodic();
        assert_eq!(picks(&Sampling::default(), &logits, 3), [6, 6, 6]);
        let forced = Sampling { logit_bias: vec![(11, 100.0)], ..Sampling::default() };
        assert_eq!(picks(&forced, &logits, 3), [11, 11, 11]);
        let hot = Sampling { temp: 1.0, seed: 5, ..forced };
        assert_eq!(picks(&hot, &logits, 3), [11, 11, 11]);
        let banned = Sampling { logit_bias: vec![(6, f32::NEG_INFINITY)], ..Sampling::default() };
        assert_eq!(picks(&banned, &logits, 2), [13, 13]);
    }

    #[test]
    fn each_penalty_stops_a_greedy_repeat() {
        let logits = periodic();
        let with = |p: Penalties| Sampling { penalties: p, ..Sampling::default() };
        let base = Penalties::default();
        for p in [
            Penalties { repeat: 2.0, ..base },
            Penalties { frequency: 1.0, ..base },
            Penalties { presence: 1.0, ..base },
        ] {
            assert_eq!(picks(&with(p), &logits, 4), [6, 13, 20, 27], "{p:?}");
        }
        // A window of none, or no penalty, repeats.
        assert_eq!(picks(&with(Penalties { last_n: 0, repeat: 2.0, ..base }), &logits, 3), [6, 6, 6]);
        // The window forgets: with one token counted, the first comes back.
        assert_eq!(picks(&with(Penalties { last_n: 1, presence: 1.0, ..base }), &logits, 3), [6, 13, 6]);
    }

    #[test]
    fn min_p_and_typical_p_narrow_the_draw() {
        // One clear favourite over a flat field.
        let logits: Vec<f32> = (0..50).map(|i| if i == 7 { 2.0 } else { 0.0 }).collect();
        let drawn = |s: Sampling| -> std::collections::BTreeSet<i32> {
            (0..16).flat_map(|seed| picks(&Sampling { seed, ..s.clone() }, &logits, 2)).collect()
        };
        let hot = Sampling { temp: 1.0, ..Sampling::default() };
        assert!(drawn(hot.clone()).len() > 3, "a plain draw varies");
        assert_eq!(drawn(Sampling { min_p: 0.5, ..hot.clone() }).into_iter().collect::<Vec<_>>(), [7]);
        // The most typical token of this field is one of the flat ones,
        // the same whatever the seed.
        assert_eq!(drawn(Sampling { typical_p: 1e-6, ..hot }).len(), 1);
    }
}
