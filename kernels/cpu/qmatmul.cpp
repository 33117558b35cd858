// Packed-weight matmuls for decode-sized row counts: y = x @ W^T with W in 32-weight blocks.
//
// Formats (one kernel per format, one entry point):
//   q4: w = d * q + m, q in 0..15 (16 bytes of nibbles a block: low nibbles are weights 0..15, high 16..31,
//       GGUF's Q4_0/Q4_1 order), d and m fp16 per block.
//   q8: w = d * q, q int8 (GGUF's Q8_0), d fp16 per block.
// Activations are quantized per row and block to int8 (d_x = max|x| / 127) and multiplied with integer dot
// products (AVX2 maddubs, or AVX512-VNNI dpbusd where the compiler may use it), as llama.cpp does. q4 is
// computed centred, w = d (q - 8) + z with z = m + 8d, and z multiplies the exact fp32 block sum of x: the
// activation rounding error then meets only d (q - 8), not the block offset (Q4_1 blocks often have |m| ~ 8d,
// and charging the error to d q + m instead was 5x worse on the default model). Every output element is
// computed by the same sequence of operations whatever the number of rows or threads, so results never
// depend on the batch.
#include "common.h"

#include <torch/library.h>

#include <vector>

namespace pagedeck {
namespace {

enum Act : int64_t { kNone = 0, kSwiGLU = 1 };

struct QuantAct {  // q (M, K) int8; per block (M, K/32): scale d, exact sum s, c = 8 d sum(q)
  std::vector<int8_t> q;
  std::vector<float> d, s, c;
};

QuantAct& scratch() {
  thread_local QuantAct a;
  return a;
}

void quantize_rows(const float* x, int64_t M, int64_t K, QuantAct& a) {
  const int64_t nb = K / kBlock;
  a.q.resize(M * K);
  a.d.resize(M * nb);
  a.s.resize(M * nb);
  a.c.resize(M * nb);
  for (int64_t r = 0; r < M * nb; ++r) {
    const float* v = x + r * kBlock;
    int8_t* q = a.q.data() + r * kBlock;
#ifdef PD_AVX2
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 x0 = _mm256_loadu_ps(v), x1 = _mm256_loadu_ps(v + 8), x2 = _mm256_loadu_ps(v + 16),
           x3 = _mm256_loadu_ps(v + 24);
    __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, x0), _mm256_andnot_ps(sign, x1)),
                              _mm256_max_ps(_mm256_andnot_ps(sign, x2), _mm256_andnot_ps(sign, x3)));
    const float amax = hmax(mx);
    a.s[r] = hsum(_mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3)));
    const float d = amax / 127.0f;
    a.d[r] = d;
    const __m256 inv = _mm256_set1_ps(d > 0.0f ? 127.0f / amax : 0.0f);
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(x0, inv)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(x1, inv)),
            i2 = _mm256_cvtps_epi32(_mm256_mul_ps(x2, inv)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(x3, inv));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // undo lane interleave
    _mm256_storeu_si256((__m256i*)q, p);
    const __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), p);
    const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    const __m128i h2 = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    a.c[r] = 8.0f * d * (float)_mm_cvtsi128_si32(_mm_add_epi32(h2, _mm_shuffle_epi32(h2, 0xb1)));
#else
    float amax = 0.0f, sum = 0.0f;
    for (int i = 0; i < kBlock; ++i) {
      amax = std::max(amax, std::fabs(v[i]));
      sum += v[i];
    }
    const float d = amax / 127.0f, inv = d > 0.0f ? 127.0f / amax : 0.0f;
    a.d[r] = d;
    a.s[r] = sum;
    int32_t isum = 0;
    for (int i = 0; i < kBlock; ++i) {
      q[i] = (int8_t)std::nearbyint(v[i] * inv);
      isum += q[i];
    }
    a.c[r] = 8.0f * d * (float)isum;
#endif
  }
}

struct Weights {
  const uint8_t* qs;
  const uint16_t* d;
  const uint16_t* m;  // q4 only
  int64_t K, nb;
  bool q4;
};

#ifdef PD_AVX2
inline __m256i dot_u8s8(__m256i u, __m256i s) {  // 8 int32 partial sums of u8 x s8 products
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// out[r] = row n of W . activation row m0 + r, for r < MT
template <int MT, bool Q4>
inline void dot_row(const Weights& w, int64_t n, const QuantAct& a, int64_t m0, float* out) {
  __m256 acc[MT];
  float mins[MT];
  for (int r = 0; r < MT; ++r) {
    acc[r] = _mm256_setzero_ps();
    mins[r] = 0.0f;
  }
  const __m256i low = _mm256_set1_epi8(0x0F);
  const uint16_t* dn = w.d + n * w.nb;
  for (int64_t j = 0; j < w.nb; ++j) {
    __m256i wu;
    if (Q4) {
      const __m128i raw = _mm_loadu_si128((const __m128i*)(w.qs + (n * w.nb + j) * 16));
      wu = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low);
    } else {
      wu = _mm256_loadu_si256((const __m256i*)(w.qs + (n * w.nb + j) * 32));
    }
    const float dw = half_to_float(dn[j]);
    const float zw = Q4 ? half_to_float(w.m[n * w.nb + j]) + 8.0f * dw : 0.0f;
    for (int r = 0; r < MT; ++r) {
      const int64_t blk = (m0 + r) * w.nb + j;
      __m256i xs = _mm256_loadu_si256((const __m256i*)(a.q.data() + blk * kBlock));
      __m256i p;
      if (Q4) {
        p = dot_u8s8(wu, xs);
      } else {
        p = dot_u8s8(_mm256_sign_epi8(wu, wu), _mm256_sign_epi8(xs, wu));
      }
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * a.d[blk]), acc[r]);
      if (Q4) mins[r] += zw * a.s[blk] - dw * a.c[blk];
    }
  }
  for (int r = 0; r < MT; ++r) out[r] = hsum(acc[r]) + mins[r];
}

inline void silu_mul(float* g, const float* u, int64_t n) {  // g = silu(g) * u
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 e = exp_neg(_mm256_or_ps(x, sign));  // exp(-|x|)
    const __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 sig = _mm256_div_ps(_mm256_blendv_ps(one, e, neg), _mm256_add_ps(one, e));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_mul_ps(x, sig), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}
#else
template <int MT, bool Q4>
inline void dot_row(const Weights& w, int64_t n, const QuantAct& a, int64_t m0, float* out) {
  for (int r = 0; r < MT; ++r) {
    float acc = 0.0f, mins = 0.0f;
    for (int64_t j = 0; j < w.nb; ++j) {
      const int64_t blk = (m0 + r) * w.nb + j;
      const int8_t* xq = a.q.data() + blk * kBlock;
      int32_t s = 0;
      for (int i = 0; i < kBlock; ++i) {
        int wq;
        if (Q4) {
          const uint8_t b = w.qs[(n * w.nb + j) * 16 + (i & 15)];
          wq = i < 16 ? (b & 15) : (b >> 4);
        } else {
          wq = (int8_t)w.qs[(n * w.nb + j) * 32 + i];
        }
        s += wq * xq[i];
      }
      const float dw = half_to_float(w.d[n * w.nb + j]);
      acc += (float)s * (dw * a.d[blk]);
      if (Q4) mins += (half_to_float(w.m[n * w.nb + j]) + 8.0f * dw) * a.s[blk] - dw * a.c[blk];
    }
    out[r] = acc + mins;
  }
}

inline void silu_mul(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}
#endif

template <bool Q4>
void rows_range(const Weights& w, const QuantAct& a, int64_t M, int64_t n, float* out) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) dot_row<4, Q4>(w, n, a, m, out + m);
  for (; m < M; ++m) dot_row<1, Q4>(w, n, a, m, out + m);
}

// y (M, Nout) for rows [n0, n1) of the output; SwiGLU pairs gate row i with up row i + Nout.
template <bool Q4>
void compute(const Weights& w, const QuantAct& a, int64_t M, int64_t Nout, Act act, int64_t n0, int64_t n1, float* y) {
  thread_local std::vector<float> col;
  col.resize(2 * M);
  if (act == kNone) {
    for (int64_t n = n0; n < n1; ++n) {
      rows_range<Q4>(w, a, M, n, col.data());
      for (int64_t m = 0; m < M; ++m) y[m * Nout + n] = col[m];
    }
    return;
  }
  thread_local std::vector<float> gate, up;
  const int64_t len = n1 - n0;
  gate.resize(M * len);
  up.resize(M * len);
  for (int64_t n = n0; n < n1; ++n) {
    rows_range<Q4>(w, a, M, n, col.data());
    rows_range<Q4>(w, a, M, n + Nout, col.data() + M);
    for (int64_t m = 0; m < M; ++m) {
      gate[m * len + n - n0] = col[m];
      up[m * len + n - n0] = col[M + m];
    }
  }
  for (int64_t m = 0; m < M; ++m) {
    silu_mul(gate.data() + m * len, up.data() + m * len, len);
    std::memcpy(y + m * Nout + n0, gate.data() + m * len, len * sizeof(float));
  }
}

at::Tensor qmatmul(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, const c10::optional<at::Tensor>& m,
                   int64_t act) {
  check_cpu_f32(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be (M, K)");
  const bool q4 = m.has_value();
  const int64_t M = x.size(0), K = x.size(1), N = qs.size(0), nb = K / kBlock;
  TORCH_CHECK(K % kBlock == 0, "K must be a multiple of 32, got ", K);
  TORCH_CHECK(qs.is_contiguous() && qs.dim() == 2 && qs.size(1) == (q4 ? K / 2 : K) &&
                  (q4 ? qs.scalar_type() == at::kByte : qs.scalar_type() == at::kChar),
              "packed weights do not match x's K or the format");
  TORCH_CHECK(d.scalar_type() == at::kHalf && d.is_contiguous() && d.size(0) == N && d.size(1) == nb, "bad scales");
  if (q4) {
    TORCH_CHECK(m->scalar_type() == at::kHalf && m->is_contiguous() && m->sizes() == d.sizes(), "bad minimums");
  }
  TORCH_CHECK(act == kNone || (act == kSwiGLU && N % 2 == 0), "bad activation");
  const int64_t Nout = act == kSwiGLU ? N / 2 : N;
  at::Tensor y = at::empty({M, Nout}, x.options());
  if (M == 0) return y;
  QuantAct& a = scratch();
  quantize_rows(x.data_ptr<float>(), M, K, a);
  Weights w{(const uint8_t*)qs.data_ptr(), (const uint16_t*)d.data_ptr(),
            q4 ? (const uint16_t*)m->data_ptr() : nullptr, K, nb, q4};
  float* out = y.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(16, Nout / (4 * at::get_num_threads()));
  const Act ac = (Act)act;
  at::parallel_for(0, Nout, grain, [&](int64_t n0, int64_t n1) {
    if (q4) {
      compute<true>(w, a, M, Nout, ac, n0, n1, out);
    } else {
      compute<false>(w, a, M, Nout, ac, n0, n1, out);
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pagedeck, lib) {
  lib.def("qmatmul(Tensor x, Tensor qs, Tensor d, Tensor? m, int act) -> Tensor", &qmatmul);
}

}  // namespace pagedeck
