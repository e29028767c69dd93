//! Byte sizes as notes write them: the sizes of one line in one unit (MiB
//! or GiB, chosen by the largest), so they compare at a glance.

const MIB: f64 = (1u64 << 20) as f64;
const GIB: f64 = (1u64 << 30) as f64;

/// `bytes` each written with one decimal in the unit of the largest: GiB
/// from 1 GiB, MiB below.
pub fn sizes<const N: usize>(bytes: [u64; N]) -> [String; N] {
    let (unit, name) = if bytes.iter().any(|&b| b >= 1 << 30) { (GIB, "GiB") } else { (MIB, "MiB") };
    bytes.map(|b| format!("{:.1} {name}", b as f64 / unit))
}

/// One size, as [`sizes`] writes it.
pub fn size(bytes: u64) -> String {
    let [s] = sizes([bytes]);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_has_one_unit() {
        assert_eq!(sizes([3 << 30, 512 << 20]), ["3.0 GiB", "0.5 GiB"]);
        assert_eq!(sizes([100 << 20, 1 << 19]), ["100.0 MiB", "0.5 MiB"]);
        assert_eq!(size(1536 << 20), "1.5 GiB");
    }
}
