//! Digests of logits: a 64-bit XXH3 of each step's logits, bit for bit, so
//! two runs can be compared for exactness with a text diff
//! (`bmoe generate --logits-digest FILE`). Text alone proves little on
//! synthetic models; a digest changes with any logit's lowest bit.

use std::io::Write;
use std::path::Path;

use xxhash_rust::xxh3::xxh3_64;

/// The digest of one step's logits: XXH3-64 of the values' IEEE-754 bits,
/// little-endian, in vocabulary order.
pub fn logits_digest(logits: &[f32]) -> u64 {
    let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
    xxh3_64(&bytes)
}

/// The digest of a whole run: XXH3-64 of the steps' digests in order.
pub fn run_digest(steps: &[u64]) -> u64 {
    let bytes: Vec<u8> = steps.iter().flat_map(|d| d.to_le_bytes()).collect();
    xxh3_64(&bytes)
}

/// Writes one line per step (`STEP DIGEST`, the digest as 16 hex digits)
/// to `path` and returns the run's digest.
pub fn write_digests(path: &Path, logits: &[Vec<f32>]) -> std::io::Result<u64> {
    let steps: Vec<u64> = logits.iter().map(|l| logits_digest(l)).collect();
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for (i, d) in steps.iter().enumerate() {
        writeln!(out, "{i} {d:016x}")?;
    }
    out.flush()?;
    Ok(run_digest(&steps))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_sees_the_lowest_bit_and_the_order() {
        let a = vec![1.0f32, -2.5, 3.25];
        let mut b = a.clone();
        b[1] = f32::from_bits(b[1].to_bits() ^ 1);
        assert_ne!(logits_digest(&a), logits_digest(&b));
        assert_eq!(logits_digest(&a), logits_digest(&a.clone()));
        // -0.0 and 0.0 compare equal as numbers but are different logits bits.
        assert_ne!(logits_digest(&[0.0]), logits_digest(&[-0.0]));
        let (x, y) = (logits_digest(&a), logits_digest(&b));
        assert_ne!(run_digest(&[x, y]), run_digest(&[y, x]));
    }

    #[test]
    fn the_file_has_a_line_per_step() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.txt");
        let run = write_digests(&path, &[vec![1.0], vec![2.0]]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0], format!("0 {:016x}", logits_digest(&[1.0])));
        assert_eq!(run, run_digest(&[logits_digest(&[1.0]), logits_digest(&[2.0])]));
    }
}
