//! `bmoe fit`: whether a model runs on this machine, resident or streamed,
//! and how fast, estimated from its GGUF header and measured speeds of this
//! machine's memory, disk and compute (docs/models.md, "What fits").

mod choice;
mod estimate;
pub mod probe;
mod shape;

pub use choice::{StreamChoice, choose_streaming};
pub use estimate::{Estimate, Machine, Mode, estimate, hit_rates};
pub use shape::ModelShape;

/// KV positions a server of `parallel` requests at once allocates, `ctx`
/// tokens each: a batch-invariant server (`bmoe serve`'s default) gives
/// each request its own KV stream and keeps one more, the spare through
/// which its slots exchange their cells.
pub fn served_positions(ctx: u32, parallel: u32, batch_invariant: bool) -> u32 {
    let spare = u32::from(batch_invariant && parallel > 1);
    ctx.saturating_mul(parallel.saturating_add(spare))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_batch_invariant_server_counts_its_spare_stream() {
        assert_eq!(super::served_positions(4096, 1, true), 4096);
        assert_eq!(super::served_positions(4096, 4, true), 5 * 4096);
        assert_eq!(super::served_positions(4096, 4, false), 4 * 4096);
    }
}
