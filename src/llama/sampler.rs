//! Token selection: greedy argmax (bmoe's own, ties to the lowest id) or
//! llama.cpp's top-k -> top-p -> temperature -> seeded draw chain.

use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

/// Sampling settings; `temp <= 0` means greedy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Temperature; 0 or less selects greedy argmax.
    pub temp: f32,
    /// Keep the k most likely tokens (0 disables the stage).
    pub top_k: i32,
    /// Keep the smallest set of tokens whose probability reaches p.
    pub top_p: f32,
    /// Seed of the random draw.
    pub seed: u32,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling { temp: 0.0, top_k: 40, top_p: 0.95, seed: 0 }
    }
}

/// A sampler built from [`Sampling`].
pub struct Sampler {
    chain: Option<NonNull<sys::llama_sampler>>,
    scratch: Vec<sys::llama_token_data>,
}

// SAFETY: the chain is owned and used by one thread at a time (&mut self).
unsafe impl Send for Sampler {}

impl Sampler {
    /// Builds the sampler.
    pub fn new(s: Sampling) -> Sampler {
        if s.temp <= 0.0 {
            return Sampler { chain: None, scratch: Vec::new() };
        }
        super::init();
        // SAFETY: constructing a chain and handing it ownership of each stage.
        let chain = unsafe {
            let chain = sys::llama_sampler_chain_init(sys::llama_sampler_chain_params { no_perf: true });
            if s.top_k > 0 {
                sys::llama_sampler_chain_add(chain, sys::llama_sampler_init_top_k(s.top_k));
            }
            sys::llama_sampler_chain_add(chain, sys::llama_sampler_init_top_p(s.top_p, 1));
            sys::llama_sampler_chain_add(chain, sys::llama_sampler_init_temp(s.temp));
            sys::llama_sampler_chain_add(chain, sys::llama_sampler_init_dist(s.seed));
            chain
        };
        Sampler { chain: NonNull::new(chain), scratch: Vec::new() }
    }

    /// Picks the next token from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> i32 {
        let Some(chain) = self.chain else { return argmax(logits) };
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
        let token = usize::try_from(arr.selected)
            .ok()
            .and_then(|i| self.scratch.get(i))
            .map_or_else(|| argmax(logits), |d| d.id);
        // SAFETY: live chain.
        unsafe { sys::llama_sampler_accept(chain.as_ptr(), token) };
        token
    }

    /// Restarts the random stream from the seed.
    pub fn reset(&mut self) {
        if let Some(chain) = self.chain {
            // SAFETY: live chain.
            unsafe { sys::llama_sampler_reset(chain.as_ptr()) };
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        if let Some(chain) = self.chain {
            // SAFETY: the chain owns its stages and is freed once.
            unsafe { sys::llama_sampler_free(chain.as_ptr()) };
        }
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
        let s = Sampling { temp: 1.0, top_k: 40, top_p: 0.95, seed: 9 };
        let run = || {
            let mut sm = Sampler::new(s);
            (0..20).map(|_| sm.sample(&logits)).collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        assert!(a.iter().any(|&t| t != a[0]), "a temperature draw should vary");
    }
}
