//! Turning a fill rule into tensor bytes: deterministic per (seed, tensor,
//! chunk), so the same seed gives the same file whatever the thread count.

use std::collections::HashMap;
use std::sync::Arc;

use half::f16;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::gguf::{GgmlType, TensorSpec};

/// How a tensor's values are produced.
#[derive(Clone)]
pub enum Fill {
    /// Every element equal to this value (norm weights, rope factors).
    Const(f32),
    /// Independent random values with this standard deviation (uniform
    /// distribution; quantized types get random quants with a matching scale).
    Random {
        /// Target standard deviation of the dequantized values.
        std: f32,
    },
    /// Random rows like [`Fill::Random`] for the first `live` of every
    /// `period` rows, zero rows for the rest: an expert's down projection
    /// that writes only to the residual stream's expert band.
    Band {
        /// Target standard deviation of the live rows' values.
        std: f32,
        /// Live rows at the start of each period.
        live: usize,
        /// Rows per period (the residual stream's width).
        period: usize,
    },
    /// Exact values, row-major in ggml order (`ne[0]` fastest).
    Values(Arc<Vec<f32>>),
    /// Exact leading rows, then every later row one of `filler`'s rows
    /// (picked by a hash of the row index): a vocabulary matrix whose
    /// filler tokens share a few rows.
    Rows {
        /// The first rows, row-major.
        head: Arc<Vec<f32>>,
        /// The rows later ones repeat, row-major (at least one).
        filler: Arc<Vec<f32>>,
    },
}

/// Bytes per generation chunk; each chunk has its own random stream.
const CHUNK_BYTES: u64 = 1 << 20;

/// Whether the generator encodes `ty` itself; every other type goes through
/// ggml's quantizer, a whole row at a time.
pub fn encodes_natively(ty: GgmlType) -> bool {
    [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0].contains(&ty)
}

/// Renders `spec` filled by `fill`, using up to `threads` threads; fails
/// only if ggml's quantizer refuses the rows (a shape `validate` let through).
#[cfg(test)]
pub fn render(spec: &TensorSpec, fill: &Fill, seed: u64, threads: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    render_into(spec, fill, seed, threads, &mut RowPools::new(seed), &mut out)?;
    Ok(out)
}

/// The pools of quantized random rows a model's tensors draw their random
/// rows from: one per (type, row width, scale), quantized by ggml once per
/// model, so that ggml's quantizer (a few MiB/s) stays off the write path.
pub struct RowPools {
    seed: u64,
    pools: HashMap<PoolKey, Arc<Vec<u8>>>,
}

/// A pool's type, row width and scale (as f32 bits).
type PoolKey = (GgmlType, usize, u32);

impl RowPools {
    /// No pools yet, for a model of seed `seed`.
    pub fn new(seed: u64) -> RowPools {
        RowPools { seed, pools: HashMap::new() }
    }

    /// The pool of `POOL_ROWS` rows of `n_per_row` uniform values of
    /// standard deviation `std`, encoded in `ty`.
    fn get(&mut self, ty: GgmlType, n_per_row: usize, std: f32) -> Result<Arc<Vec<u8>>, String> {
        let key = (ty, n_per_row, std.to_bits());
        if let Some(pool) = self.pools.get(&key) {
            return Ok(pool.clone());
        }
        let stream = name_hash(&format!("{ty}/{n_per_row}/{:08x}", key.2));
        let mut rng = ChaCha8Rng::seed_from_u64(mix(self.seed ^ POOL_SEED ^ stream));
        let row_bytes = ty.row_bytes(n_per_row as u64).ok_or("rows are not whole blocks")? as usize;
        let mut rows = vec![0u8; POOL_ROWS * row_bytes];
        encode_rows(ty, &uniform(std, POOL_ROWS * n_per_row, &mut rng), n_per_row, &mut rows)?;
        let pool = Arc::new(rows);
        self.pools.insert(key, pool.clone());
        Ok(pool)
    }
}

/// Renders `spec` filled by `fill` into `out` (resized to the tensor's
/// bytes; a buffer used before is reused, which spares the page faults of a
/// fresh allocation), using up to `threads` threads; fails only if ggml's
/// quantizer refuses the rows (a shape `validate` let through).
pub fn render_into(
    spec: &TensorSpec,
    fill: &Fill,
    seed: u64,
    threads: usize,
    pools: &mut RowPools,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let size = spec.size() as usize;
    out.clear();
    out.resize(size, 0);
    if let Fill::Rows { head, filler } = fill {
        return render_rows(spec, head, filler, out).map_err(|e| format!("{}: {e}", spec.name));
    }
    let block_bytes = spec.ty.block_bytes() as usize;
    let block_elems = spec.ty.block_elems() as usize;
    let n_per_row = spec.dims.first().copied().unwrap_or(1) as usize;
    // ggml quantizes whole rows: those types are rendered in row-aligned chunks.
    let unit = if encodes_natively(spec.ty) && !matches!(fill, Fill::Band { .. }) {
        block_bytes
    } else {
        spec.ty
            .row_bytes(n_per_row as u64)
            .ok_or_else(|| format!("{}: rows of {n_per_row} are not whole {} blocks", spec.name, spec.ty))?
            as usize
    };
    let chunk = ((CHUNK_BYTES as usize) / unit).max(1) * unit;
    let tensor_seed = mix(seed ^ name_hash(&spec.name));
    // Random rows of ggml-quantized types come from a pool quantized once:
    // the tensor then fills at memory speed instead of the quantizer's.
    let rows = size / unit;
    let pool = match fill {
        Fill::Random { std } | Fill::Band { std, .. } if !encodes_natively(spec.ty) && rows > POOL_ROWS => {
            Some(pools.get(spec.ty, n_per_row, *std).map_err(|e| format!("{}: {e}", spec.name))?)
        }
        _ => None,
    };
    let pool = pool.as_deref();
    // A band's dead rows are all one encoded zero row.
    let zero_row = match fill {
        Fill::Band { .. } => {
            let mut row = vec![0u8; unit];
            encode_rows(spec.ty, &vec![0.0; n_per_row], n_per_row, &mut row)
                .map_err(|e| format!("{}: {e}", spec.name))?;
            Some(row)
        }
        _ => None,
    };
    let zero_row = zero_row.as_deref();
    let chunks: Vec<(usize, &mut [u8])> = out.chunks_mut(chunk).enumerate().collect();
    let per_thread = chunks.len().div_ceil(threads.max(1));
    let mut groups: Vec<Vec<(usize, &mut [u8])>> = Vec::new();
    let mut it = chunks.into_iter().peekable();
    while it.peek().is_some() {
        groups.push(it.by_ref().take(per_thread.max(1)).collect());
    }
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let workers: Vec<_> = groups
            .into_iter()
            .map(|group| {
                s.spawn(move || {
                    for (index, bytes) in group {
                        let first_elem = index * (chunk / block_bytes) * block_elems;
                        let mut rng = ChaCha8Rng::seed_from_u64(mix(tensor_seed ^ index as u64));
                        match (fill, zero_row) {
                            (&Fill::Band { std, live, period }, Some(zero)) => {
                                let first_row = index * (chunk / unit);
                                for (i, row) in bytes.chunks_exact_mut(unit).enumerate() {
                                    if (first_row + i) % period.max(1) >= live {
                                        row.copy_from_slice(zero);
                                    } else if let Some(pool) = pool {
                                        fill_from_pool(pool, unit, row, &mut rng);
                                    } else {
                                        fill_chunk(spec.ty, &Fill::Random { std }, 0, n_per_row, row, &mut rng)?;
                                    }
                                }
                            }
                            _ => match pool {
                                Some(pool) => fill_from_pool(pool, unit, bytes, &mut rng),
                                None => fill_chunk(spec.ty, fill, first_elem, n_per_row, bytes, &mut rng)?,
                            },
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or_else(|_| Err("a fill thread panicked".into()))).collect()
    });
    results.into_iter().collect::<Result<(), String>>().map_err(|e| format!("{}: {e}", spec.name))
}

/// Renders a [`Fill::Rows`] tensor into `out` (sized): its head and filler
/// rows are encoded once, and each filler row is a copy.
fn render_rows(spec: &TensorSpec, head: &[f32], filler: &[f32], out: &mut [u8]) -> Result<(), String> {
    let n_per_row = spec.dims.first().copied().unwrap_or(1) as usize;
    let row_bytes = spec.ty.row_bytes(n_per_row as u64).ok_or("rows are not whole blocks")? as usize;
    let head_rows = (head.len() / n_per_row).min(out.len() / row_bytes);
    let filler_rows = filler.len() / n_per_row;
    let (head_out, rest) = out.split_at_mut(head_rows * row_bytes);
    encode_rows(spec.ty, &head[..head_rows * n_per_row], n_per_row, head_out)?;
    if !rest.is_empty() {
        if filler_rows == 0 {
            return Err("no filler rows for the rows after the head".into());
        }
        let mut pool = vec![0u8; filler_rows * row_bytes];
        encode_rows(spec.ty, &filler[..filler_rows * n_per_row], n_per_row, &mut pool)?;
        for (i, row) in rest.chunks_exact_mut(row_bytes).enumerate() {
            let pick = mix((head_rows + i) as u64) as usize % filler_rows;
            row.copy_from_slice(&pool[pick * row_bytes..][..row_bytes]);
        }
    }
    Ok(())
}

/// Rows in each pool of [`RowPools`].
const POOL_ROWS: usize = 256;
/// Mixed into the model's seed for the pools' random streams.
const POOL_SEED: u64 = 0x9001_0000;

/// Fills `out`, whole rows of `row_bytes`, with rows drawn at random from
/// `pool`.
fn fill_from_pool(pool: &[u8], row_bytes: usize, out: &mut [u8], rng: &mut ChaCha8Rng) {
    let pool_rows = pool.len() / row_bytes;
    for row in out.chunks_exact_mut(row_bytes) {
        let pick = rng.next_u32() as usize % pool_rows;
        row.copy_from_slice(&pool[pick * row_bytes..][..row_bytes]);
    }
}

fn fill_chunk(
    ty: GgmlType,
    fill: &Fill,
    first_elem: usize,
    n_per_row: usize,
    out: &mut [u8],
    rng: &mut ChaCha8Rng,
) -> Result<(), String> {
    let n = out.len() / ty.block_bytes() as usize * ty.block_elems() as usize;
    match fill {
        Fill::Random { std } if encodes_natively(ty) => {
            fill_random(ty, *std, out, rng);
            Ok(())
        }
        Fill::Random { std } => encode_rows(ty, &uniform(*std, n, rng), n_per_row, out),
        Fill::Const(c) => encode_rows(ty, &vec![*c; n], n_per_row, out),
        Fill::Values(values) => encode_rows(ty, &values[first_elem..first_elem + n], n_per_row, out),
        Fill::Rows { .. } => unreachable!("rendered by render_rows"),
        Fill::Band { .. } => unreachable!("rendered row by row in render_into"),
    }
}

/// `n` uniform values of standard deviation `std`.
fn uniform(std: f32, n: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    // Uniform on [-a, a] has std a / sqrt(3).
    let a = std * 3f32.sqrt();
    (0..n).map(|_| a * signed_unit(rng.next_u32())).collect()
}

/// Encodes whole rows of `n_per_row` values: natively where the generator
/// can, else with ggml's quantizer.
pub(super) fn encode_rows(ty: GgmlType, values: &[f32], n_per_row: usize, out: &mut [u8]) -> Result<(), String> {
    if encodes_natively(ty) {
        encode(ty, values, out);
        Ok(())
    } else {
        crate::llama::quant::quantize_rows(ty.id(), values, n_per_row, out)
    }
}

/// Random data straight in the target encoding (no float detour for quants).
fn fill_random(ty: GgmlType, std: f32, out: &mut [u8], rng: &mut ChaCha8Rng) {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q8_0 => {
            rng.fill_bytes(out);
            // Raw random quants have mean -0.5 (nibbles -8..7, bytes -128..127);
            // summed over thousands of weights that bias swamps the signal.
            // Mapping the lone negative extreme to 0 makes them symmetric.
            let (table, spread) = if ty == GgmlType::Q4_0 { (&*Q4_SYMMETRIC, 4.18) } else { (&*Q8_SYMMETRIC, 73.47) };
            let d = f16::from_f32(std / spread).to_le_bytes();
            for block in out.chunks_mut(ty.block_bytes() as usize) {
                block[..2].copy_from_slice(&d);
                for q in &mut block[2..] {
                    *q = table[*q as usize];
                }
            }
        }
        _ => {
            let n = out.len() / ty.block_bytes() as usize * ty.block_elems() as usize;
            encode(ty, &uniform(std, n, rng), out);
        }
    }
}

/// Byte remaps making random q4_0 nibbles (stored value 0 = -8) and q8_0
/// bytes (-128) symmetric around zero.
static Q4_SYMMETRIC: std::sync::LazyLock<[u8; 256]> = std::sync::LazyLock::new(|| {
    let fix = |n: u8| if n == 0 { 8 } else { n };
    std::array::from_fn(|b| fix(b as u8 & 15) | (fix(b as u8 >> 4) << 4))
});
static Q8_SYMMETRIC: std::sync::LazyLock<[u8; 256]> =
    std::sync::LazyLock::new(|| std::array::from_fn(|b| if b == 0x80 { 0 } else { b as u8 }));

/// Maps 32 random bits to a float in [-1, 1).
fn signed_unit(bits: u32) -> f32 {
    (bits >> 8) as f32 / (1u32 << 23) as f32 - 1.0
}

/// Encodes floats in `ty`; `out` holds exactly `values.len()` elements.
pub fn encode(ty: GgmlType, values: &[f32], out: &mut [u8]) {
    match ty {
        GgmlType::F32 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(4)) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes());
            }
        }
        GgmlType::Q8_0 => {
            for (block, o) in values.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
                let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                o[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                for (q, v) in o[2..].iter_mut().zip(block) {
                    *q = ((v * inv).round() as i8) as u8;
                }
            }
        }
        GgmlType::Q4_0 => {
            for (block, o) in values.chunks_exact(32).zip(out.chunks_exact_mut(18)) {
                // ggml's reference: the value of largest magnitude maps to -8.
                let max = block.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                let d = max / -8.0;
                let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
                o[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                for j in 0..16 {
                    let lo = ((block[j] * inv + 8.5) as u8).min(15);
                    let hi = ((block[j + 16] * inv + 8.5) as u8).min(15);
                    o[2 + j] = lo | (hi << 4);
                }
            }
        }
        other => unreachable!("synthetic models do not encode {other}"),
    }
}

/// FNV-1a over the tensor name, so each tensor has its own stream.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// SplitMix64 finalizer: spreads nearby seeds apart.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_bytes_any_thread_count() {
        let spec = TensorSpec::new("blk.0.ffn_up_exps.weight", &[64, 64, 40], GgmlType::Q4_0);
        let fill = Fill::Random { std: 0.02 };
        let a = render(&spec, &fill, 7, 1).unwrap();
        let b = render(&spec, &fill, 7, 3).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, render(&spec, &fill, 8, 1).unwrap());
    }

    /// A vocabulary matrix: its head renders exactly as the same values
    /// would, every later row is one of the filler rows, and a reused
    /// buffer renders the same bytes as a fresh one.
    #[test]
    fn rows_render_the_head_exactly_and_repeat_the_fillers() {
        let (d, head_rows, total) = (32usize, 5usize, 40u64);
        let head: Vec<f32> = (0..head_rows * d).map(|i| (i as f32 * 0.37).sin()).collect();
        let filler: Vec<f32> = (0..2 * d).map(|i| (i as f32 * 0.11).cos()).collect();
        for ty in [GgmlType::F16, GgmlType::Q8_0] {
            let spec = TensorSpec::new("token_embd.weight", &[d as u64, total], ty);
            let fill = Fill::Rows { head: Arc::new(head.clone()), filler: Arc::new(filler.clone()) };
            let bytes = render(&spec, &fill, 3, 2).unwrap();
            let row = ty.row_bytes(d as u64).unwrap() as usize;
            let exact = render(
                &TensorSpec::new("h", &[d as u64, head_rows as u64], ty),
                &Fill::Values(Arc::new(head.clone())),
                3,
                1,
            )
            .unwrap();
            assert_eq!(bytes[..head_rows * row], exact[..], "{ty}");
            let fillers =
                render(&TensorSpec::new("f", &[d as u64, 2], ty), &Fill::Values(Arc::new(filler.clone())), 3, 1)
                    .unwrap();
            for r in bytes[head_rows * row..].chunks(row) {
                assert!(r == &fillers[..row] || r == &fillers[row..], "{ty}: a filler row is not one of the pool's");
            }
            let mut reused = vec![7u8; 3 * bytes.len()];
            render_into(&spec, &fill, 3, 2, &mut RowPools::new(3), &mut reused).unwrap();
            assert_eq!(reused, bytes, "{ty}: a reused buffer");
        }
    }

    /// A band renders random rows for the first `live` of every period and
    /// one encoded zero row for the others, natively and through ggml's
    /// quantizer (pooled or not), the same on any number of threads.
    #[test]
    fn a_band_is_random_inside_and_zero_outside() {
        let (width, period, live, experts) = (256u64, 16usize, 2usize, 40u64);
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::from_name("q4_K").unwrap(), GgmlType::F16] {
            let spec = TensorSpec::new("blk.0.ffn_down_exps.weight", &[width, period as u64, experts], ty);
            let fill = Fill::Band { std: 0.5, live, period };
            let bytes = render(&spec, &fill, 9, 1).unwrap();
            assert_eq!(bytes, render(&spec, &fill, 9, 3).unwrap(), "{ty}: thread count");
            let row = ty.row_bytes(width).unwrap() as usize;
            let mut zero = vec![0u8; row];
            encode_rows(ty, &vec![0.0; width as usize], width as usize, &mut zero).unwrap();
            for (r, bytes) in bytes.chunks(row).enumerate() {
                if r % period < live {
                    assert_ne!(bytes, &zero[..], "{ty}: live row {r} is zero");
                } else {
                    assert_eq!(bytes, &zero[..], "{ty}: row {r} outside the band");
                }
            }
        }
    }

    #[test]
    fn random_quants_are_zero_mean() {
        for (ty, bias) in [(GgmlType::Q4_0, 8i64), (GgmlType::Q8_0, 0)] {
            let spec = TensorSpec::new("w", &[256, 256], ty);
            let bytes = render(&spec, &Fill::Random { std: 1.0 }, 1, 2).unwrap();
            let mut sum = 0i64;
            let mut n = 0i64;
            for block in bytes.chunks(ty.block_bytes() as usize) {
                for &q in &block[2..] {
                    if ty == GgmlType::Q4_0 {
                        sum += i64::from(q & 15) - bias + i64::from(q >> 4) - bias;
                        n += 2;
                    } else {
                        sum += i64::from(q as i8);
                        n += 1;
                    }
                }
            }
            let mean = sum as f64 / n as f64;
            assert!(mean.abs() < 0.05 * if ty == GgmlType::Q4_0 { 1.0 } else { 16.0 }, "{ty}: mean {mean}");
        }
    }

    #[test]
    fn q8_0_round_trips_within_a_step() {
        let values: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) / 10.0).collect();
        let mut out = vec![0u8; 68];
        encode(GgmlType::Q8_0, &values, &mut out);
        let d = f16::from_le_bytes([out[0], out[1]]).to_f32();
        for (i, v) in values[..32].iter().enumerate() {
            let q = out[2 + i] as i8 as f32 * d;
            assert!((q - v).abs() <= d, "{q} vs {v}");
        }
    }
}
