// Activations of the packed matmul (qmatmul.cpp): each row quantized to int8 per 32-weight block (quantize_rows: d_x
// = max|x| / 127, with the block's exact fp32 sum and integer sum beside it) or, for the K-quant formats and iq4xs
// (and their groups), per 256 (quantize_k, llama.cpp's Q8_K), and SwiGLU's silu(gate) * up, the matmul's fused
// epilogue (and gpt-oss's clamped form, the MoE kernel's). Each has its vector form and, for CPUs without AVX2, its
// portable loop beside it.
#pragma once

#include "common.h"
#include "kquant.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace pagedeck {

// Activations as Q8_K: per row r and super-block s (stride nsb): q (M, K) int8 in natural order, scale d[r * nsb + s]
// = max|x| / 127, bs[(r * nsb + s) * 8 + b] = sum of sub-block b's 32 codes (|bs| <= 32 * 127; q4k's minimums and
// iq4xs's offset of 128 meet them) and hs[(r * nsb + s) * 16 + h] = the sum of its h-th 16 codes (q6's offset of 32
// meets them).
struct ActK {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int16_t> bs, hs;
  int64_t nsb = 0;
};

// q (M, K) int8; per block, rows padded with zeros to nbp = a multiple of 8 blocks (M, nbp): scale d,
// exact sum s, c = 8 d sum(q), isum = sum(q)
struct QuantAct {
  std::vector<int8_t> q;
  std::vector<float> d, s, c;
  std::vector<int32_t> isum;
  int64_t nbp = 0;
  ActK k;  // the K-quants' and iq4xs's activations (per 256, quantize_k) instead of the per-32 ones
};

inline QuantAct& scratch() {
  thread_local QuantAct a;
  return a;
}

#ifdef PD_AVX2
// q[0..32) = the int8 codes of v[0..32) * inv, rounded to nearest even; returns their sums in int32 pairs of
// 4 codes (8 lanes, exact)
inline __m256i quantize32(const float* v, __m256 inv, int8_t* q) {
  const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v), inv));
  const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 8), inv));
  const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 16), inv));
  const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 24), inv));
  __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // undo lane interleave
  _mm256_storeu_si256((__m256i*)q, p);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), _mm256_set1_epi16(1));
}
#endif

// Activations a thread quantizes at least (values): a decode step's rows (8 x 14,336 at most for an 8B's down)
// stay on the calling thread, no fork and join added to it; a prompt's are split over the threads (every block's
// result is its own whichever thread computes it).
constexpr int64_t kQuantizeGrain = 1 << 18;

// One block of 32 activations v into q (int8) and its slot r of a's per-block figures.
inline void quantize_block(const float* v, int8_t* q, QuantAct& a, int64_t r) {
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
  const __m256i s32 = quantize32(v, inv, q);
  a.isum[r] = hsum_i32(s32);
  a.c[r] = 8.0f * d * (float)a.isum[r];
#else  // portable
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
  a.isum[r] = isum;
  a.c[r] = 8.0f * d * (float)isum;
#endif
}

// pairs: q4's layout, each pair of blocks (j, j+1) stored as [x_j[0:16], x_j+1[0:16], x_j[16:32], x_j+1[16:32]]
// so that one 32-byte load of the two blocks' nibbles meets its activations without a cross-lane shuffle
// (an odd last block stays as it is).
inline void quantize_rows(const float* x, int64_t M, int64_t K, QuantAct& a, bool pairs) {
  const int64_t nb = K / kBlock, nbp = (nb + 7) / 8 * 8;
  a.nbp = nbp;
  a.q.resize(M * K);
  a.d.assign(M * nbp, 0.0f);
  a.s.assign(M * nbp, 0.0f);
  a.c.assign(M * nbp, 0.0f);
  a.isum.assign(M * nbp, 0);
  at::parallel_for(0, M * nb, kQuantizeGrain / kBlock, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk)
      quantize_block(x + blk * kBlock, a.q.data() + blk * kBlock, a, blk / nb * nbp + blk % nb);
  });
#ifdef PD_AVX2
  if (!pairs) return;
  at::parallel_for(0, M, std::max<int64_t>(1, kQuantizeGrain / K), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      for (int64_t j = 0; j + 1 < nb; j += 2) {
        __m256i* p = (__m256i*)(a.q.data() + (m * nb + j) * kBlock);
        const __m256i b0 = _mm256_loadu_si256(p), b1 = _mm256_loadu_si256(p + 1);
        _mm256_storeu_si256(p, _mm256_permute2x128_si256(b0, b1, 0x20));
        _mm256_storeu_si256(p + 1, _mm256_permute2x128_si256(b0, b1, 0x31));
      }
    }
  });
#else  // portable: the unpaired layout, which the portable dot_tile reads
  (void)pairs;
#endif
}

// x (M, K) as Q8_K activations (ActK), one scale a 256 values
inline void quantize_k(const float* x, int64_t M, int64_t K, ActK& a) {
  const int64_t nsb = K / q4k::kSuper;
  a.nsb = nsb;
  a.q.resize(M * K);
  a.d.resize(M * nsb);
  a.bs.resize(M * nsb * 8);
  a.hs.resize(M * nsb * 16);
  at::parallel_for(0, M * nsb, kQuantizeGrain / q4k::kSuper, [&](int64_t s0, int64_t s1) {
    for (int64_t sbi = s0; sbi < s1; ++sbi) {
      const float* v = x + sbi * q4k::kSuper;
      int8_t* q = a.q.data() + sbi * q4k::kSuper;
#ifdef PD_AVX2
      const __m256 sign = _mm256_set1_ps(-0.0f);
      __m256 mx = _mm256_setzero_ps();
      for (int i = 0; i < q4k::kSuper; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
      const float amax = hmax(mx);
      const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
      for (int b = 0; b < 8; ++b) {  // quantize32's lanes 0-3 sum codes 0..15, lanes 4-7 codes 16..31
        const __m256i s32 = quantize32(v + 32 * b, inv, q + 32 * b);
        __m128i t = _mm_hadd_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
        t = _mm_hadd_epi32(t, t);  // [lo, hi, lo, hi]
        const int32_t lo = _mm_cvtsi128_si32(t), hi = _mm_extract_epi32(t, 1);
        a.hs[sbi * 16 + 2 * b] = (int16_t)lo;
        a.hs[sbi * 16 + 2 * b + 1] = (int16_t)hi;
        a.bs[sbi * 8 + b] = (int16_t)(lo + hi);
      }
#else  // portable
      float amax = 0.0f;
      for (int i = 0; i < q4k::kSuper; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      for (int h = 0; h < 16; ++h) {
        int32_t s = 0;
        for (int i = 16 * h; i < 16 * h + 16; ++i) s += q[i] = (int8_t)std::nearbyint(v[i] * inv);
        a.hs[sbi * 16 + h] = (int16_t)s;
      }
      for (int b = 0; b < 8; ++b) a.bs[sbi * 8 + b] = (int16_t)(a.hs[sbi * 16 + 2 * b] + a.hs[sbi * 16 + 2 * b + 1]);
#endif
      a.d[sbi] = amax / 127.0f;
    }
  });
}

#ifdef PD_AVX2
// sigmoid(z) for eight lanes, from exp(-|z|) so it never overflows; silu and the clamped SwiGLU share it.
inline __m256 sigmoid8(__m256 z) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = exp_neg(_mm256_or_ps(z, _mm256_set1_ps(-0.0f)));  // exp(-|z|)
  const __m256 neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
  return _mm256_div_ps(_mm256_blendv_ps(one, e, neg), _mm256_add_ps(one, e));
}

// eight(g, u) over n columns, eight at a time; a shorter tail goes through the same vector arithmetic
// (zero-padded), so an element's result never depends on where its range of columns ends.
template <class Eight>
inline void by_eights(float* g, const float* u, int64_t n, Eight eight) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) eight(g + i, u + i);
  if (i < n) {
    alignas(32) float gt[8] = {}, ut[8] = {};
    std::memcpy(gt, g + i, (n - i) * sizeof(float));
    std::memcpy(ut, u + i, (n - i) * sizeof(float));
    eight(gt, ut);
    std::memcpy(g + i, gt, (n - i) * sizeof(float));
  }
}

// g = silu(g) * u (by_eights: an element's result never depends on where a thread's range of columns ends).
inline void silu_mul(float* g, const float* u, int64_t n) {
  by_eights(g, u, n, [](float* gp, const float* up) {
    const __m256 x = _mm256_loadu_ps(gp);
    _mm256_storeu_ps(gp, _mm256_mul_ps(_mm256_mul_ps(x, sigmoid8(x)), _mm256_loadu_ps(up)));
  });
}
#else  // portable: silu through std::exp
inline void silu_mul(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}
#endif

// gpt-oss's clamped SwiGLU: with g' = min(g, limit) and u' = u clamped to [-limit, limit],
// g = (u' + 1) * (g' * sigmoid(alpha * g')), the operations in that order (engine.model.moe.clamped_swiglu, whose
// torch path calls this same function through the clamped_swiglu op, so the MoE kernel's epilogue and the torch
// path round alike). A NaN stays a NaN as torch's clamp keeps it; by_eights keeps an element's result independent
// of where its range of columns ends.
#ifdef PD_AVX2
inline void clamped_swiglu(float* g, const float* u, int64_t n, float limit, float alpha) {
  const __m256 one = _mm256_set1_ps(1.0f), hi = _mm256_set1_ps(limit), lo = _mm256_set1_ps(-limit),
               al = _mm256_set1_ps(alpha);
  by_eights(g, u, n, [&](float* gp, const float* up) {
    const __m256 x = _mm256_min_ps(hi, _mm256_loadu_ps(gp));  // min_ps returns its second operand on a NaN
    const __m256 v = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_loadu_ps(up)));
    _mm256_storeu_ps(gp, _mm256_mul_ps(_mm256_add_ps(v, one), _mm256_mul_ps(x, sigmoid8(_mm256_mul_ps(x, al)))));
  });
}
#else  // portable: the sigmoid through std::exp
inline void clamped_swiglu(float* g, const float* u, int64_t n, float limit, float alpha) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = g[i] > limit ? limit : g[i];
    const float v = u[i] > limit ? limit : u[i] < -limit ? -limit : u[i];
    const float z = x * alpha, e = std::exp(-std::fabs(z));
    const float sig = (z < 0.0f ? e : 1.0f) / (1.0f + e);
    const float p = x * sig, w = v + 1.0f;
    g[i] = w * p;
  }
}
#endif

// out (rows, I) = act(gate row, up row) for gate_up (rows, 2 I) = [gate | up], act(g, u, I) writing into g:
// the torch-facing form of an epilogue (the silu_mul and clamped_swiglu ops), so torch paths get its bits.
template <typename Act>
at::Tensor gated_rows(const at::Tensor& gate_up, const Act& act) {
  check_cpu_f32(gate_up, "gate_up");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "gate_up must be (rows, 2 I), got ", gate_up.sizes());
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  at::Tensor out = at::empty({T, I}, gate_up.options());
  const float* p = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      std::copy_n(p + r * 2 * I, I, o + r * I);
      act(o + r * I, p + r * 2 * I + I, I);
    }
  });
  return out;
}

}  // namespace pagedeck
