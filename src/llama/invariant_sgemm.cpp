// Dense float matmuls in llamafile's sgemm order at every width, for bmoe's
// batch-invariant contexts (src/llama/invariant_sgemm.rs says why).
//
// llamafile's sgemm sums every output cell over the inner dimension in one
// order whatever tile it computes the cell in: one vector accumulator of KN
// lanes (16 with AVX-512, 8 with AVX2), a fused multiply-add per KN values,
// then a horizontal sum. So a column gets the same bits in any call of two
// columns or more. ggml gives a lone column to vec_dot instead, which sums in
// another order. Weights placed in the buffer type below run, in a backend in
// reference mode, through the sgemm from two columns and, for one column,
// through the matvec here, which sums each cell exactly as the sgemm does.
// Everything else (other ops on these weights, any op outside reference mode,
// shapes the sgemm declines) is left to ggml, which reads the weights in their
// plain layout.
//
// This reaches ggml's CPU backend below its public API: the extra buffer type
// interface (ggml-cpu/traits.h) and the list of extra buffer types the CPU
// backend asks before computing a node. build.rs compiles it against the
// llama.cpp source the pinned llama-cpp-sys-2 vendors, with the same compiler,
// so the intrinsics below expand as they do in the sgemm.

#include "ggml-backend-impl.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-cpu/ggml-cpu-impl.h"
#include "ggml-cpu/llamafile/sgemm.h"
#include "ggml-cpu/traits.h"

#include <cstring>
#include <mutex>

#if defined(__x86_64__)
#    include <immintrin.h>
#endif

namespace {

// Conversion slices start on multiples of this many values, so a value's
// conversion takes the same path whatever the thread count.
constexpr int64_t kSliceValues = 64;

// The sgemm's vector width in floats (KN), 0 where this file does not
// reproduce its order; fixed at registration.
int64_t g_lanes = 0;

ggml_backend_buffer_type_t invariant_buffer_type();

#if defined(__x86_64__)
// One output cell as the sgemm computes it, for rows r0..r1 of `a` (f16 or
// f32, row stride `lda` bytes) times the column `b` (the same type): one
// accumulator per cell, as in the sgemm's tiles. Rows go one after the
// other, so a thread reads its weights as one stream, as vec_dot does: the
// out-of-order core overlaps one row's sums with the next's, and a decode
// step's weights come from memory, not cache. Eight rows at a time (eight
// streams a page apart) read a matrix from memory about 10% slower.
#    define BMOE_AVX512 __attribute__((target("avx512f,f16c,fma")))
BMOE_AVX512 inline __m512 load16(const float * p) {
    return _mm512_loadu_ps(p);
}

BMOE_AVX512 inline __m512 load16(const ggml_fp16_t * p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) p));
}

template <typename T>
BMOE_AVX512 void matvec16(const char * a, size_t lda, const T * b, float * c, int64_t r0, int64_t r1, int64_t k) {
    for (int64_t i = r0; i < r1; i++) {
        const T * ai = (const T *) (a + i * lda);
        __m512    ci = _mm512_setzero_ps();
        for (int64_t l = 0; l < k; l += 16) {
            ci = _mm512_fmadd_ps(load16(ai + l), load16(b + l), ci);
        }
        c[i] = _mm512_reduce_add_ps(ci);
    }
}

#    define BMOE_AVX2 __attribute__((target("avx2,f16c,fma")))
BMOE_AVX2 inline __m256 load8(const float * p) {
    return _mm256_loadu_ps(p);
}

BMOE_AVX2 inline __m256 load8(const ggml_fp16_t * p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) p));
}

// The sgemm's horizontal sum of eight lanes.
BMOE_AVX2 inline float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    x        = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x        = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

template <typename T>
BMOE_AVX2 void matvec8(const char * a, size_t lda, const T * b, float * c, int64_t r0, int64_t r1, int64_t k) {
    for (int64_t i = r0; i < r1; i++) {
        const T * ai = (const T *) (a + i * lda);
        __m256    ci = _mm256_setzero_ps();
        for (int64_t l = 0; l < k; l += 8) {
            ci = _mm256_fmadd_ps(load8(ai + l), load8(b + l), ci);
        }
        c[i] = hsum8(ci);
    }
}

template <typename T> void matvec(const char * a, size_t lda, const T * b, float * c, int64_t r0, int64_t r1, int64_t k) {
    if (g_lanes == 16) {
        matvec16(a, lda, b, c, r0, r1, k);
    } else {
        matvec8(a, lda, b, c, r0, r1, k);
    }
}
#endif

// The columns of the call: src1 flattened (the weight is one 2-D matrix).
int64_t columns(const ggml_tensor * op) {
    return op->src[1]->ne[1] * op->src[1]->ne[2] * op->src[1]->ne[3];
}

// Whether `t` is f32 laid out densely by its strides, dimensions of one
// included: ggml_is_contiguous skips those, so a strided view of one column
// would pass where the same view of two does not, and a matmul would then
// take another kernel by its width.
bool dense_f32(const ggml_tensor * t) {
    return t->type == GGML_TYPE_F32 && t->nb[0] == sizeof(float) && t->nb[1] == t->nb[0] * t->ne[0] &&
           t->nb[2] == t->nb[1] * t->ne[1] && t->nb[3] == t->nb[2] * t->ne[2];
}

// Whether this matmul takes the sgemm's order at every width: a 2-D f32 or
// f16 weight with contiguous rows, a row count the sgemm's x86-64 tiles
// divide and an inner dimension of whole vectors (the sgemm's tail adds
// masked lanes, which the matvec does not reproduce), a dense f32 input and
// output. Nothing here depends on the number of columns.
bool handles(const ggml_tensor * op) {
    if (op->op != GGML_OP_MUL_MAT || g_lanes == 0) {
        return false;
    }
    const ggml_tensor * w = op->src[0];
    const ggml_tensor * x = op->src[1];
    return (w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_F32) && w->ne[2] == 1 && w->ne[3] == 1 &&
           w->nb[0] == ggml_type_size(w->type) && w->ne[1] % 4 == 0 && w->ne[0] % g_lanes == 0 && dense_f32(x) &&
           dense_f32(op) && x->ne[0] == w->ne[0];
}

// Bytes of the input converted to f16 (f16 weights only).
size_t input_bytes(const ggml_tensor * op) {
    return op->src[0]->type == GGML_TYPE_F16 ? size_t(columns(op) * op->src[0]->ne[0]) * sizeof(ggml_fp16_t) : 0;
}

class invariant_traits : public ggml::cpu::tensor_traits {
  public:
    bool work_size(int, const ggml_tensor * op, size_t & size) override {
        if (!handles(op)) {
            return false;
        }
        // At least what ggml's own matmul needs, for a backend not in reference mode.
        const ggml_type vec_dot_type = ggml_get_type_traits_cpu(op->src[0]->type)->vec_dot_type;
        const size_t    own          = size_t(columns(op)) * ggml_row_size(vec_dot_type, op->src[0]->ne[0]);
        size                         = input_bytes(op) > own ? input_bytes(op) : own;
        return true;
    }

    bool compute_forward(ggml_compute_params * params, ggml_tensor * op) override {
#if defined(__x86_64__)
        if (!params->use_ref || !handles(op) || params->wsize < input_bytes(op)) {
            return false;
        }
        const ggml_tensor * w   = op->src[0];
        const ggml_tensor * x   = op->src[1];
        const int64_t       k   = w->ne[0];
        const int64_t       m   = w->ne[1];
        const int64_t       n   = columns(op);
        const bool          f16 = w->type == GGML_TYPE_F16;
        const float * const src = (const float *) x->data;
        const void *        b   = src;
        if (f16) {
            // The sgemm takes an f16 weight's input in f16: this thread's
            // share of each column, on slice boundaries.
            const int64_t slices = (k + kSliceValues - 1) / kSliceValues;
            const int64_t lo     = slices * params->ith / params->nth * kSliceValues;
            const int64_t hi0    = slices * (params->ith + 1) / params->nth * kSliceValues;
            const int64_t hi     = hi0 < k ? hi0 : k;
            ggml_fp16_t * dst    = (ggml_fp16_t *) params->wdata;
            for (int64_t j = 0; j < n && lo < hi; j++) {
                ggml_cpu_fp32_to_fp16(src + j * k + lo, dst + j * k + lo, hi - lo);
            }
            ggml_barrier(params->threadpool);
            b = dst;
        }
        if (n == 1) {
            const int64_t r0 = m * params->ith / params->nth;
            const int64_t r1 = m * (params->ith + 1) / params->nth;
            if (f16) {
                matvec((const char *) w->data, w->nb[1], (const ggml_fp16_t *) b, (float *) op->data, r0, r1, k);
            } else {
                matvec((const char *) w->data, w->nb[1], (const float *) b, (float *) op->data, r0, r1, k);
            }
            return true;
        }
        // The same answer on every thread: it depends on the shapes only.
        return llamafile_sgemm(params, m, n, k, w->data, w->nb[1] / ggml_type_size(w->type), b, k, op->data, m,
                               w->type, f16 ? GGML_TYPE_F16 : GGML_TYPE_F32, GGML_TYPE_F32);
#else
        (void) params;
        (void) op;
        return false;
#endif
    }
};

class invariant_extra : public ggml::cpu::extra_buffer_type {
  public:
    bool supports_op(ggml_backend_dev_t, const ggml_tensor * op) override {
        // The weights keep the plain layout, so every op reads them as it
        // would from a CPU buffer; a matmul needs an input ggml converts.
        return op->op != GGML_OP_MUL_MAT || op->src[1]->type == GGML_TYPE_F32 || op->src[1]->type == GGML_TYPE_F16;
    }

    ggml::cpu::tensor_traits * get_tensor_traits(const ggml_tensor * op) override {
        if (op->op == GGML_OP_MUL_MAT && op->src[0]->buffer && op->src[0]->buffer->buft == invariant_buffer_type()) {
            return &traits;
        }
        return nullptr;
    }

  private:
    invariant_traits traits;
};

const char * invariant_get_name(ggml_backend_buffer_type_t) {
    return "CPU_INVARIANT_SGEMM";
}

ggml_backend_buffer_t invariant_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size) {
    // A CPU buffer under this type's name: the bytes are plain.
    ggml_backend_buffer_t buffer = ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(), size);
    if (buffer != nullptr) {
        buffer->buft = buft;
    }
    return buffer;
}

size_t invariant_get_alignment(ggml_backend_buffer_type_t) {
    return ggml_backend_buft_get_alignment(ggml_backend_cpu_buffer_type());
}

ggml_backend_buffer_type_t invariant_buffer_type() {
    static ggml_backend_buffer_type type = {
        /* .iface   = */ {
            /* .get_name         = */ invariant_get_name,
            /* .alloc_buffer     = */ invariant_alloc_buffer,
            /* .alloc_buffer_n   = */ nullptr,
            /* .get_alignment    = */ invariant_get_alignment,
            /* .get_max_size     = */ nullptr,
            /* .get_alloc_size   = */ nullptr,
            /* .get_alloc_size_n = */ nullptr,
            /* .is_host          = */ nullptr,
        },
        /* .device  = */ ggml_backend_reg_dev_get(ggml_backend_cpu_reg(), 0),
        /* .context = */ new invariant_extra(),
    };
    return &type;
}

}  // namespace

extern "C" {

// The buffer type, registered with the CPU backend on the first call; null
// where the sgemm is not built or its order is not the one reproduced here
// (x86-64 with AVX-512 or AVX2, F16C and FMA). Call it before any graph
// computes: the registration appends to a list the compute threads read.
ggml_backend_buffer_type_t bmoe_invariant_sgemm_buffer_type(void) {
    static ggml_backend_buffer_type_t registered = nullptr;
#if defined(__x86_64__)
    static std::once_flag once;
    std::call_once(once, [] {
        if (!ggml_cpu_has_llamafile() || !ggml_cpu_has_fma() || !ggml_cpu_has_f16c()) {
            return;
        }
        if (ggml_cpu_has_avx512()) {
            g_lanes = 16;
        } else if (ggml_cpu_has_avx2()) {
            g_lanes = 8;
        } else {
            return;
        }
        // Let the device copy its list of extra buffer types first, so that
        // llama.cpp's own choice of buffers for a model never offers this one.
        ggml_backend_reg_t reg = ggml_backend_cpu_reg();
        auto get = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(
            reg, "ggml_backend_dev_get_extra_bufts");
        if (get != nullptr) {
            get(ggml_backend_reg_dev_get(reg, 0));
        }
        ggml_backend_cpu_get_extra_buffer_types().push_back(invariant_buffer_type());
        registered = invariant_buffer_type();
    });
#endif
    return registered;
}
}
