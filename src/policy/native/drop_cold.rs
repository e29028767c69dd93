//! `drop-cold` by the reference engine's rule: drop slot i when it is not
//! the first slot of largest weight, its expert is not resident, and its
//! weight is below `F / k`.

use crate::policy::{DropCall, DropPolicy};

/// Native twin of the `drop-cold` plugin.
#[derive(Debug, Clone, Copy)]
pub struct DropCold {
    /// Threshold as a fraction of the uniform share `1/k`.
    pub f: f32,
}

impl Default for DropCold {
    fn default() -> DropCold {
        DropCold { f: 0.75 }
    }
}

impl DropPolicy for DropCold {
    fn decide(&mut self, call: &DropCall<'_>) -> Result<Vec<u32>, String> {
        if call.experts.is_empty() || call.k == 0 {
            return Ok(Vec::new());
        }
        let threshold = self.f / call.k as f32;
        let top =
            (0..call.weights.len()).fold(0, |best, i| if call.weights[i] > call.weights[best] { i } else { best });
        let mut out: Vec<u32> = Vec::new();
        for i in 0..call.experts.len() {
            let drop = i != top && !call.resident[i] && call.weights[i] < threshold;
            if drop && !out.contains(&call.experts[i]) {
                out.push(call.experts[i]);
            }
        }
        Ok(out)
    }
}
