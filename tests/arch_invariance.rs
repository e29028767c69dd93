//! Batch invariance on every generated architecture: with the batch-invariant
//! kernels (ggml's reference mode, and the invariant sgemm for dense f32
//! weights where the build has it), a run gives the same tokens and every
//! step's logits bit for bit whether its prompt is read one token at a time,
//! three at a time or whole. The same runs on the fast kernels differ, so
//! the check can fail.

mod common;

use bmoe::engine::SessionOptions;
use bmoe::synth::Arch;
use common::*;

const N: u32 = 6;

#[test]
fn every_architecture_reads_its_prompt_in_any_chunks_bit_for_bit() {
    let dir = tempdir();
    let mut fast_differs = Vec::new();
    for arch in Arch::ALL {
        let name = arch.name();
        let m = write_tiny(dir.path(), &format!("{name}.gguf"), *arch, |_| {});
        let with = |ubatch: u32, batch_invariant: bool| SessionOptions { ubatch, batch_invariant, ..options(&m, None) };
        let (whole, _) = run(with(64, true), N);
        for ubatch in [1, 3] {
            let (chunked, _) = run(with(ubatch, true), N);
            assert_identical(&whole, &chunked, &format!("{name}, batch-invariant, prompt in chunks of {ubatch}"));
        }
        let (fast_whole, _) = run(with(64, false), N);
        let (fast_single, _) = run(with(1, false), N);
        if first_difference(&fast_whole, &fast_single).is_some() {
            fast_differs.push(name);
        }
    }
    // llamafile's sgemm takes a prompt of f32 weights from two columns and
    // vec_dot one token: the fast kernels' chunks must show it.
    assert!(
        fast_differs.len() * 2 > Arch::ALL.len(),
        "the fast kernels gave the same bits in chunks of 1 and 64 on most architectures ({} of {}): the check \
         cannot tell invariant kernels from the others",
        fast_differs.len(),
        Arch::ALL.len()
    );
}
