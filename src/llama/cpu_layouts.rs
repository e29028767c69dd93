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

use crate::gguf::GgmlType;

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

/// The quantized types ggml can repack, by ggml type id.
const REPACKABLE_TYPES: [u32; 9] = [
    sys::GGML_TYPE_Q4_0,
    sys::GGML_TYPE_Q4_K,
    sys::GGML_TYPE_Q5_K,
    sys::GGML_TYPE_Q6_K,
    sys::GGML_TYPE_Q2_K,
    sys::GGML_TYPE_IQ4_NL,
    sys::GGML_TYPE_MXFP4,
    sys::GGML_TYPE_Q8_0,
    sys::GGML_TYPE_Q1_0,
];

/// The layout (columns x interleave, ggml's name) ggml picks for a weight of
/// type `ty` whose row count is a multiple of 8, given `f`; `None` where it
/// keeps the file's layout.
pub fn layout_for(ty: GgmlType, f: LayoutFeatures) -> Option<&'static str> {
    let neon_i8mm = f.neon && f.i8mm;
    let neon_dot = f.neon && f.dotprod;
    match ty.name() {
        "q4_0" if f.avx2 || (f.sve_bytes == 32 && f.i8mm) => Some("8x8"),
        "q4_0" | "q8_0" | "q1_0" if neon_i8mm => Some("4x8"),
        "q4_0" | "q8_0" | "q1_0" | "iq4_nl" | "mxfp4" if neon_dot => Some("4x4"),
        "q4_K" if f.avx2 || neon_i8mm => Some("8x8"),
        "q5_K" | "q6_K" if neon_i8mm => Some("8x8"),
        "q4_K" | "q5_K" | "q6_K" if neon_dot => Some("8x4"),
        "q2_K" if f.avx512 => Some("8x8"),
        "iq4_nl" | "mxfp4" if f.avx2 => Some("8x8"),
        _ => None,
    }
}

/// The repackable types as [`GgmlType`]s (all known to the project's type table).
fn repackable_types() -> impl Iterator<Item = GgmlType> {
    REPACKABLE_TYPES.into_iter().filter_map(GgmlType::from_id)
}

/// The repacked layouts in use on this CPU, as `"q4_0 4x4"` per type the
/// backend repacks (probed with a 256 x 8 weight); `"q4_0 repacked"` where
/// the backend repacks a type these rules do not name.
pub fn repacked_layouts() -> Vec<String> {
    let features = LayoutFeatures::detect();
    repackable_types()
        .filter(|ty| super::Repacker::new(ty.id(), 256, 8).is_some())
        .map(|ty| match layout_for(ty, features) {
            Some(layout) => format!("{ty} {layout}"),
            None => format!("{ty} repacked"),
        })
        .collect()
}

/// The layout this CPU's llama.cpp repacks weights of type `ty` into, when
/// it repacks them.
pub fn layout_of_type(ty: GgmlType) -> Option<&'static str> {
    layout_for(ty, LayoutFeatures::detect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PI5: LayoutFeatures = LayoutFeatures { neon: true, dotprod: true, ..NONE };
    const NONE: LayoutFeatures =
        LayoutFeatures { avx2: false, avx512: false, neon: false, dotprod: false, i8mm: false, sve_bytes: 0 };

    fn named(name: &str) -> GgmlType {
        GgmlType::from_name(name).unwrap()
    }

    #[test]
    fn every_repackable_type_is_a_known_ggml_type() {
        assert_eq!(repackable_types().count(), REPACKABLE_TYPES.len());
    }

    #[test]
    fn arm_layouts_follow_dotprod_i8mm_and_sve() {
        let with = |name| layout_for(named(name), PI5);
        assert_eq!(
            [with("q4_0"), with("q4_K"), with("q8_0"), with("q2_K")],
            [Some("4x4"), Some("8x4"), Some("4x4"), None]
        );
        let i8mm = LayoutFeatures { i8mm: true, ..PI5 };
        assert_eq!([layout_for(named("q4_0"), i8mm), layout_for(named("q6_K"), i8mm)], [Some("4x8"), Some("8x8")]);
        let sve256 = LayoutFeatures { sve_bytes: 32, ..i8mm };
        assert_eq!(layout_for(named("q4_0"), sve256), Some("8x8"));
        let neon_only = LayoutFeatures { neon: true, ..NONE };
        assert!(repackable_types().all(|ty| layout_for(ty, neon_only).is_none()));
    }

    #[test]
    fn x86_layouts_are_8x8_with_avx2() {
        let avx2 = LayoutFeatures { avx2: true, ..NONE };
        assert_eq!(
            [layout_for(named("q4_0"), avx2), layout_for(named("q4_K"), avx2), layout_for(named("q2_K"), avx2)],
            [Some("8x8"), Some("8x8"), None]
        );
        assert_eq!(layout_for(named("q2_K"), LayoutFeatures { avx512: true, ..avx2 }), Some("8x8"));
    }

    #[test]
    fn every_repacked_type_on_this_cpu_has_a_named_layout() {
        // The rules above must agree with what the linked backend repacks.
        let f = LayoutFeatures::detect();
        for ty in repackable_types() {
            let repacks = super::super::Repacker::new(ty.id(), 256, 8).is_some();
            assert_eq!(repacks, layout_for(ty, f).is_some(), "{ty} on {f:?}");
        }
    }
}
