//! Which repacked weight layouts the linked llama.cpp uses on this CPU.
//!
//! llama.cpp's CPU backend keeps some quantized weights with rows
//! interleaved for its faster kernels ([`super::Repacker`]), in a layout
//! chosen per type from the CPU's features: on x86 the 8x8 layouts with
//! AVX2 (q2_K needs AVX-512); on ARM 4x4 or 8x4 with dotprod, 4x8 or 8x8
//! with i8mm, q4_0 8x8 with 256-bit SVE and i8mm. ggml does not name the
//! layout it picks, so [`repacked_layouts`] applies the selection rules of
//! the vendored `ggml-cpu/repack.cpp` to the features the backend reports,
//! and lists a type only where the backend really repacks it.

use llama_cpp_sys_2 as sys;

/// The CPU features ggml's layout choice depends on, as the linked CPU
/// backend reports them (compiled in and, on ARM, present at run time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayoutFeatures {
    /// x86 AVX2.
    pub avx2: bool,
    /// x86 AVX-512F.
    pub avx512: bool,
    /// ARM NEON (Advanced SIMD).
    pub neon: bool,
    /// ARM dot product (`sdot`/`udot`, armv8.2-a+dotprod).
    pub dotprod: bool,
    /// ARM int8 matrix multiply (`smmla`, armv8.6-a+i8mm).
    pub i8mm: bool,
    /// ARM SVE vector length in bytes; 0 without SVE.
    pub sve_bytes: u32,
}

impl LayoutFeatures {
    /// The linked CPU backend's features.
    pub fn detect() -> LayoutFeatures {
        super::init();
        // SAFETY: plain queries of ggml's CPU feature flags.
        unsafe {
            LayoutFeatures {
                avx2: sys::ggml_cpu_has_avx2() != 0,
                avx512: sys::ggml_cpu_has_avx512() != 0,
                neon: sys::ggml_cpu_has_neon() != 0,
                dotprod: sys::ggml_cpu_has_dotprod() != 0,
                i8mm: sys::ggml_cpu_has_matmul_int8() != 0,
                sve_bytes: if sys::ggml_cpu_has_sve() != 0 { sys::ggml_cpu_get_sve_cnt().max(0) as u32 } else { 0 },
            }
        }
    }
}

/// The quantized types ggml can repack, as (name, ggml type id).
const REPACKABLE_TYPES: [(&str, u32); 9] = [
    ("Q4_0", sys::GGML_TYPE_Q4_0),
    ("Q4_K", sys::GGML_TYPE_Q4_K),
    ("Q5_K", sys::GGML_TYPE_Q5_K),
    ("Q6_K", sys::GGML_TYPE_Q6_K),
    ("Q2_K", sys::GGML_TYPE_Q2_K),
    ("IQ4_NL", sys::GGML_TYPE_IQ4_NL),
    ("MXFP4", sys::GGML_TYPE_MXFP4),
    ("Q8_0", sys::GGML_TYPE_Q8_0),
    ("Q1_0", sys::GGML_TYPE_Q1_0),
];

/// The layout (columns x interleave, ggml's name) ggml picks for a weight of
/// type `name` whose row count is a multiple of 8, given `f`; `None` where
/// it keeps the file's layout.
pub fn layout_for(name: &str, f: LayoutFeatures) -> Option<&'static str> {
    let neon_i8mm = f.neon && f.i8mm;
    let neon_dot = f.neon && f.dotprod;
    match name {
        "Q4_0" if f.avx2 || (f.sve_bytes == 32 && f.i8mm) => Some("8x8"),
        "Q4_0" | "Q8_0" | "Q1_0" if neon_i8mm => Some("4x8"),
        "Q4_0" | "Q8_0" | "Q1_0" | "IQ4_NL" | "MXFP4" if neon_dot => Some("4x4"),
        "Q4_K" if f.avx2 || neon_i8mm => Some("8x8"),
        "Q5_K" | "Q6_K" if neon_i8mm => Some("8x8"),
        "Q4_K" | "Q5_K" | "Q6_K" if neon_dot => Some("8x4"),
        "Q2_K" if f.avx512 => Some("8x8"),
        "IQ4_NL" | "MXFP4" if f.avx2 => Some("8x8"),
        _ => None,
    }
}

/// The repacked layouts in use on this CPU, as `"Q4_0 4x4"` per type the
/// backend repacks (probed with a 256 x 8 weight); `"Q4_0 repacked"` where
/// the backend repacks a type these rules do not name.
pub fn repacked_layouts() -> Vec<String> {
    let features = LayoutFeatures::detect();
    REPACKABLE_TYPES
        .iter()
        .filter(|(_, id)| super::Repacker::new(*id, 256, 8).is_some())
        .map(|(name, _)| match layout_for(name, features) {
            Some(layout) => format!("{name} {layout}"),
            None => format!("{name} repacked"),
        })
        .collect()
}

/// The layout this CPU's llama.cpp repacks weights of ggml type `type_id`
/// into, when it repacks them.
pub fn layout_of_type(type_id: u32) -> Option<&'static str> {
    let (name, _) = REPACKABLE_TYPES.iter().find(|(_, id)| *id == type_id)?;
    layout_for(name, LayoutFeatures::detect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PI5: LayoutFeatures = LayoutFeatures { neon: true, dotprod: true, ..NONE };
    const NONE: LayoutFeatures =
        LayoutFeatures { avx2: false, avx512: false, neon: false, dotprod: false, i8mm: false, sve_bytes: 0 };

    #[test]
    fn arm_layouts_follow_dotprod_i8mm_and_sve() {
        let with = |name| layout_for(name, PI5);
        assert_eq!(
            [with("Q4_0"), with("Q4_K"), with("Q8_0"), with("Q2_K")],
            [Some("4x4"), Some("8x4"), Some("4x4"), None]
        );
        let i8mm = LayoutFeatures { i8mm: true, ..PI5 };
        assert_eq!([layout_for("Q4_0", i8mm), layout_for("Q6_K", i8mm)], [Some("4x8"), Some("8x8")]);
        let sve256 = LayoutFeatures { sve_bytes: 32, ..i8mm };
        assert_eq!(layout_for("Q4_0", sve256), Some("8x8"));
        let neon_only = LayoutFeatures { neon: true, ..NONE };
        assert!(REPACKABLE_TYPES.iter().all(|(n, _)| layout_for(n, neon_only).is_none()));
    }

    #[test]
    fn x86_layouts_are_8x8_with_avx2() {
        let avx2 = LayoutFeatures { avx2: true, ..NONE };
        assert_eq!(
            [layout_for("Q4_0", avx2), layout_for("Q4_K", avx2), layout_for("Q2_K", avx2)],
            [Some("8x8"), Some("8x8"), None]
        );
        assert_eq!(layout_for("Q2_K", LayoutFeatures { avx512: true, ..avx2 }), Some("8x8"));
    }

    #[test]
    fn every_repacked_type_on_this_cpu_has_a_named_layout() {
        // The rules above must agree with what the linked backend repacks.
        let f = LayoutFeatures::detect();
        for (name, id) in REPACKABLE_TYPES {
            let repacks = super::super::Repacker::new(id, 256, 8).is_some();
            assert_eq!(repacks, layout_for(name, f).is_some(), "{name} on {f:?}");
        }
    }
}
