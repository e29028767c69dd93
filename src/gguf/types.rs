//! The ggml tensor element types a GGUF file may name, with their block geometry.

use std::fmt;

/// A ggml tensor type as stored in a GGUF tensor info (`ggml_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(u32);

/// Geometry of one type: elements per block and bytes per block.
struct TypeInfo {
    id: u32,
    name: &'static str,
    block_elems: u64,
    block_bytes: u64,
}

/// Every type the vendored ggml defines (ids 4, 5 and 31..38 were removed upstream).
const TYPES: &[TypeInfo] = &[
    TypeInfo { id: 0, name: "f32", block_elems: 1, block_bytes: 4 },
    TypeInfo { id: 1, name: "f16", block_elems: 1, block_bytes: 2 },
    TypeInfo { id: 2, name: "q4_0", block_elems: 32, block_bytes: 18 },
    TypeInfo { id: 3, name: "q4_1", block_elems: 32, block_bytes: 20 },
    TypeInfo { id: 6, name: "q5_0", block_elems: 32, block_bytes: 22 },
    TypeInfo { id: 7, name: "q5_1", block_elems: 32, block_bytes: 24 },
    TypeInfo { id: 8, name: "q8_0", block_elems: 32, block_bytes: 34 },
    TypeInfo { id: 9, name: "q8_1", block_elems: 32, block_bytes: 36 },
    TypeInfo { id: 10, name: "q2_K", block_elems: 256, block_bytes: 84 },
    TypeInfo { id: 11, name: "q3_K", block_elems: 256, block_bytes: 110 },
    TypeInfo { id: 12, name: "q4_K", block_elems: 256, block_bytes: 144 },
    TypeInfo { id: 13, name: "q5_K", block_elems: 256, block_bytes: 176 },
    TypeInfo { id: 14, name: "q6_K", block_elems: 256, block_bytes: 210 },
    TypeInfo { id: 15, name: "q8_K", block_elems: 256, block_bytes: 292 },
    TypeInfo { id: 16, name: "iq2_xxs", block_elems: 256, block_bytes: 66 },
    TypeInfo { id: 17, name: "iq2_xs", block_elems: 256, block_bytes: 74 },
    TypeInfo { id: 18, name: "iq3_xxs", block_elems: 256, block_bytes: 98 },
    TypeInfo { id: 19, name: "iq1_s", block_elems: 256, block_bytes: 50 },
    TypeInfo { id: 20, name: "iq4_nl", block_elems: 32, block_bytes: 18 },
    TypeInfo { id: 21, name: "iq3_s", block_elems: 256, block_bytes: 110 },
    TypeInfo { id: 22, name: "iq2_s", block_elems: 256, block_bytes: 82 },
    TypeInfo { id: 23, name: "iq4_xs", block_elems: 256, block_bytes: 136 },
    TypeInfo { id: 24, name: "i8", block_elems: 1, block_bytes: 1 },
    TypeInfo { id: 25, name: "i16", block_elems: 1, block_bytes: 2 },
    TypeInfo { id: 26, name: "i32", block_elems: 1, block_bytes: 4 },
    TypeInfo { id: 27, name: "i64", block_elems: 1, block_bytes: 8 },
    TypeInfo { id: 28, name: "f64", block_elems: 1, block_bytes: 8 },
    TypeInfo { id: 29, name: "iq1_m", block_elems: 256, block_bytes: 56 },
    TypeInfo { id: 30, name: "bf16", block_elems: 1, block_bytes: 2 },
    TypeInfo { id: 34, name: "tq1_0", block_elems: 256, block_bytes: 54 },
    TypeInfo { id: 35, name: "tq2_0", block_elems: 256, block_bytes: 66 },
    TypeInfo { id: 39, name: "mxfp4", block_elems: 32, block_bytes: 17 },
    TypeInfo { id: 40, name: "nvfp4", block_elems: 64, block_bytes: 36 },
    TypeInfo { id: 41, name: "q1_0", block_elems: 128, block_bytes: 18 },
    TypeInfo { id: 42, name: "q2_0", block_elems: 64, block_bytes: 18 },
];

impl GgmlType {
    /// 32-bit float.
    pub const F32: GgmlType = GgmlType(0);
    /// 16-bit IEEE float.
    pub const F16: GgmlType = GgmlType(1);
    /// 4-bit blocks of 32 with one f16 scale.
    pub const Q4_0: GgmlType = GgmlType(2);
    /// 8-bit blocks of 32 with one f16 scale.
    pub const Q8_0: GgmlType = GgmlType(8);
    /// bfloat16.
    pub const BF16: GgmlType = GgmlType(30);

    /// The type with this numeric id, if ggml defines it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TYPES.iter().any(|t| t.id == id).then_some(GgmlType(id))
    }

    /// The type with this lower-case ggml name (`q4_0`, `f16`, `q4_K`...).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TYPES.iter().find(|t| t.name.eq_ignore_ascii_case(name)).map(|t| GgmlType(t.id))
    }

    /// The numeric id stored in files.
    pub fn id(self) -> u32 {
        self.0
    }

    fn info(self) -> &'static TypeInfo {
        TYPES.iter().find(|t| t.id == self.0).expect("GgmlType is only constructed from known ids")
    }

    /// ggml's name for the type.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Elements per quantization block (1 for plain types).
    pub fn block_elems(self) -> u64 {
        self.info().block_elems
    }

    /// Bytes per quantization block.
    pub fn block_bytes(self) -> u64 {
        self.info().block_bytes
    }

    /// Bytes of one row of `elems` elements, or `None` when `elems` is not a
    /// whole number of blocks or the size overflows.
    pub fn row_bytes(self, elems: u64) -> Option<u64> {
        let info = self.info();
        if !elems.is_multiple_of(info.block_elems) {
            return None;
        }
        (elems / info.block_elems).checked_mul(info.block_bytes)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in TYPES {
            let ty = GgmlType::from_name(t.name).unwrap();
            assert_eq!(ty.id(), t.id);
            assert_eq!(GgmlType::from_id(t.id), Some(ty));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(1000), None);
    }

    #[test]
    fn row_bytes_needs_whole_blocks() {
        assert_eq!(GgmlType::Q4_0.row_bytes(64), Some(36));
        assert_eq!(GgmlType::Q4_0.row_bytes(48), None);
        assert_eq!(GgmlType::F32.row_bytes(3), Some(12));
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
    }

    /// Our table must agree with the ggml we link, type by type.
    #[test]
    fn table_matches_linked_ggml() {
        for t in TYPES {
            let (elems, bytes) = crate::llama::ggml_type_geometry(t.id);
            assert_eq!((elems, bytes), (t.block_elems, t.block_bytes), "type {}", t.name);
        }
    }
}
