//! ggml's reference quantizer: real blocks of any type ggml can quantize
//! (K-quants, IQ types, MXFP4), from f32 values, checked as llama.cpp checks
//! a file's data at load.

use llama_cpp_sys_2 as sys;

/// Quantizes `values`, whole rows of `n_per_row` values, into `out` in the
/// ggml type `type_id` (`out` holds exactly those rows). Types that need an
/// importance matrix (iq2_xxs, iq2_xs, iq1_s) get a uniform one. The result
/// is validated: finite scales, values in range.
pub fn quantize_rows(type_id: u32, values: &[f32], n_per_row: usize, out: &mut [u8]) -> Result<(), String> {
    if type_id >= sys::GGML_TYPE_COUNT {
        return Err(format!("ggml type {type_id} does not exist"));
    }
    let ty: sys::ggml_type = type_id;
    // SAFETY: pure lookups in ggml's type table for an id in its range.
    let (block, row_bytes) = unsafe { (sys::ggml_blck_size(ty) as usize, sys::ggml_row_size(ty, n_per_row as i64)) };
    if n_per_row == 0 || block == 0 || !n_per_row.is_multiple_of(block) || !values.len().is_multiple_of(n_per_row) {
        return Err(format!("{} values in rows of {n_per_row} are not whole blocks of {block}", values.len()));
    }
    let rows = values.len() / n_per_row;
    if out.len() != rows * row_bytes {
        return Err(format!("{rows} rows need {} bytes, the output has {}", rows * row_bytes, out.len()));
    }
    let importance = vec![1.0f32; n_per_row];
    // SAFETY: `values` holds `rows * n_per_row` floats, `out` exactly
    // `rows` rows of this type, `importance` one weight per column; ggml
    // initializes its IQ tables itself (under its own lock).
    let written = unsafe {
        let imatrix = if sys::ggml_quantize_requires_imatrix(ty) { importance.as_ptr() } else { std::ptr::null() };
        sys::ggml_quantize_chunk(
            ty,
            values.as_ptr(),
            out.as_mut_ptr().cast(),
            0,
            rows as i64,
            n_per_row as i64,
            imatrix,
        )
    };
    if written != out.len() {
        return Err(format!("ggml wrote {written} of {} bytes", out.len()));
    }
    // SAFETY: `out` is `out.len()` bytes of this type's blocks.
    if !unsafe { sys::ggml_validate_row_data(ty, out.as_ptr().cast(), out.len()) } {
        return Err("ggml's quantizer wrote blocks that fail its own validation".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantizes_and_refuses_partial_blocks() {
        let values: Vec<f32> = (0..512).map(|i| (i as f32 * 0.37).sin() * 0.1).collect();
        // q4_K: 256 values a block of 144 bytes.
        let mut out = vec![0u8; 2 * 144];
        quantize_rows(12, &values, 256, &mut out).unwrap();
        assert!(out.iter().any(|&b| b != 0));
        // iq2_xxs needs an importance matrix: it gets a uniform one.
        let mut out = vec![0u8; 2 * 66];
        quantize_rows(16, &values, 256, &mut out).unwrap();
        let err = quantize_rows(12, &values[..500], 250, &mut vec![0u8; 288]).unwrap_err();
        assert!(err.contains("whole blocks"), "{err}");
        assert!(quantize_rows(12, &values, 256, &mut [0u8; 10]).unwrap_err().contains("need 288 bytes"));
    }
}
