// The q4k format's kernels: GGUF Q4_K super-blocks kept as the file stores them (kquant.h states the layout
// and decodes it), per-row and GEMM paths.
//
// The arithmetic is llama.cpp's Q4_K x Q8_K: activations quantized per 256 (activations.h's quantize_k: one fp32 scale d_x a
// super-block, int8 codes, and bs_b = the integer sum of sub-block b's 32 codes), the 6-bit scales and
// minimums applied as integers,
//   I = sum_b sc_b (q_b . x_b),   J = sum_b m_b bs_b       (exact int32)
// and fp32 only once a super-block: acc = fma(I, d d_x, acc), then acc = fnmadd(J, dmin d_x, acc), the result
// the last acc. The old arithmetic (fp32 d * sc per 32 and an fp32 multiply-add per 32-block) held the GEMM to
// about half of vpdpbusd's peak. The per-row path (tile) and the GEMM path (gemm_tile, over panels from
// unpack_panel) build the same integers and then run this one fp32 chain per output element, so their bits
// are the same for any batch, row order or thread count.
#pragma once

#include "activations.h"
#include "common.h"
#include "kquant.h"
#include "panel.h"

#include <algorithm>
#include <vector>

namespace pagedeck {
namespace q4k {

#ifdef PD_AVX2
// out[r] = weight row . activation rows m0..m0+MT. Per 32 nibble bytes c: the low nibbles (sub-block 2c) meet
// x[64c : 64c+32], the high ones x[64c+32 : 64c+64]; maddubs gives int16 pairs (at most 2 * 15 * 127) and
// one madd with the sub-block's scale broadcast as int16 adds sc_b times them into I's int32 lanes.
template <int MT>
inline void tile(const uint8_t* row, int64_t nsb, const ActK& a, int64_t K, int64_t m0, float* out) {
  float acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = 0.0f;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = row + s * kBytes;
    prefetch_super(sb);
    const __m128i v = scales(sb);
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(v));
    const __m128i mn16 = _mm_cvtepu8_epi16(_mm_srli_si128(v, 8));
    __m256i isum[MT];
    for (int r = 0; r < MT; ++r) isum[r] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256((const __m256i*)(sb + 16 + 32 * c));
      const __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      const __m256i slo = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)((4 * c + 1) << 8 | 4 * c)));
      const __m256i shi = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)((4 * c + 3) << 8 | (4 * c + 2))));
      for (int r = 0; r < MT; ++r) {  // two independent madds a chunk: no 8-deep dpwssd latency chain
        const int8_t* x = a.q.data() + (m0 + r) * K + s * kSuper + 64 * c;
        const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i*)x)), slo);
        const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i*)(x + 32))), shi);
        isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(p0, p1));
      }
    }
    const float d = half_at(sb), dmin = half_at(sb + 2);
    for (int r = 0; r < MT; ++r) {
      const int64_t at = (m0 + r) * nsb + s;
      const __m128i bs = _mm_loadu_si128((const __m128i*)(a.bs.data() + at * 8));
      __m128i t = _mm_add_epi32(_mm256_castsi256_si128(isum[r]), _mm256_extracti128_si256(isum[r], 1));
      t = _mm_hadd_epi32(t, _mm_madd_epi16(bs, mn16));  // [I01, I23, J01, J23]
      t = _mm_hadd_epi32(t, t);                          // [I, J, I, J]
      acc[r] = step(acc[r], _mm_cvtsi128_si32(t), _mm_extract_epi32(t, 1), d, dmin, a.d[at]);
    }
  }
  for (int r = 0; r < MT; ++r) out[r] = acc[r];
}
#ifdef PD_AVX512
// tile's integers with 512-bit registers: 64 nibble bytes (chunks 2k and 2k+1) a load, the low nibbles
// (sub-blocks 4k, 4k+2) meeting x[128k : +32] | x[128k+64 : +32], the high ones (4k+1, 4k+3) the other halves;
// the same exact I and J, so the same bits (the scale broadcasts are one vpermw per register)
template <int MT>
inline void tile512(const uint8_t* row, int64_t nsb, const ActK& a, int64_t K, int64_t m0, float* out) {
  float acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = 0.0f;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  auto idx = [](int u, int v) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)u)), _mm256_set1_epi16((short)v), 1);
  };
  const __m512i ix[4] = {idx(0, 2), idx(1, 3), idx(4, 6), idx(5, 7)};
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = row + s * kBytes;
    prefetch_super(sb);
    const __m128i v = scales(sb);
    const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(v));
    const __m128i mn16 = _mm_cvtepu8_epi16(_mm_srli_si128(v, 8));
    __m512i isum[MT];
    for (int r = 0; r < MT; ++r) isum[r] = _mm512_setzero_si512();
    for (int k = 0; k < 2; ++k) {
      const __m512i raw = _mm512_loadu_si512((const void*)(sb + 16 + 64 * k));
      const __m512i lo = _mm512_and_si512(raw, m4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
      const __m512i slo = _mm512_permutexvar_epi16(ix[2 * k], sc16), shi = _mm512_permutexvar_epi16(ix[2 * k + 1], sc16);
      for (int r = 0; r < MT; ++r) {
        const int8_t* x = a.q.data() + (m0 + r) * K + s * kSuper + 128 * k;
        const __m512i x0 = _mm512_loadu_si512((const void*)x), x1 = _mm512_loadu_si512((const void*)(x + 64));
        const __m512i xl = _mm512_shuffle_i64x2(x0, x1, 0x44), xh = _mm512_shuffle_i64x2(x0, x1, 0xEE);
        isum[r] = _mm512_dpwssd_epi32(isum[r], _mm512_maddubs_epi16(lo, xl), slo);
        isum[r] = _mm512_dpwssd_epi32(isum[r], _mm512_maddubs_epi16(hi, xh), shi);
      }
    }
    const float d = half_at(sb), dmin = half_at(sb + 2);
    for (int r = 0; r < MT; ++r) {
      const int64_t at = (m0 + r) * nsb + s;
      const __m128i bs = _mm_loadu_si128((const __m128i*)(a.bs.data() + at * 8));
      const __m256i i8 = _mm256_add_epi32(_mm512_castsi512_si256(isum[r]), _mm512_extracti64x4_epi64(isum[r], 1));
      __m128i t = _mm_add_epi32(_mm256_castsi256_si128(i8), _mm256_extracti128_si256(i8, 1));
      t = _mm_hadd_epi32(t, _mm_madd_epi16(bs, mn16));  // [I01, I23, J01, J23]
      t = _mm_hadd_epi32(t, t);                          // [I, J, I, J]
      acc[r] = step(acc[r], _mm_cvtsi128_si32(t), _mm_extract_epi32(t, 1), d, dmin, a.d[at]);
    }
  }
  for (int r = 0; r < MT; ++r) out[r] = acc[r];
}
#define PD_Q4K_TILE tile512
#else
#define PD_Q4K_TILE tile
#endif
#else
template <int MT>
inline void tile(const uint8_t* row, int64_t nsb, const ActK& a, int64_t K, int64_t m0, float* out) {
  for (int r = 0; r < MT; ++r) {
    float acc = 0.0f;
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* sb = row + s * kBytes;
      uint8_t sm[16];
      scale_mins(sb, sm);
      const int64_t at = (m0 + r) * nsb + s;
      int32_t I = 0, J = 0;
      for (int b = 0; b < 8; ++b) {
        int32_t dot = 0;
        for (int i = 0; i < 32; ++i) dot += code(sb, 32 * b + i) * a.q[(m0 + r) * K + s * kSuper + 32 * b + i];
        I += sm[b] * dot;
        J += sm[8 + b] * a.bs[at * 8 + b];
      }
      acc = step(acc, I, J, half_at(sb), half_at(sb + 2), a.d[at]);
    }
    out[r] = acc;
  }
}
#define PD_Q4K_TILE tile
#endif

// out[m] = weight row n . activation row m, 4 activation rows sharing each unpacked super-block
inline void weight_row(const uint8_t* qs, int64_t K, const ActK& a, int64_t M, int64_t n, float* out) {
  const int64_t nsb = K / kSuper;
  const uint8_t* row = qs + n * nsb * kBytes;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) PD_Q4K_TILE<4>(row, nsb, a, K, m, out + m);
  for (; m < M; ++m) PD_Q4K_TILE<1>(row, nsb, a, K, m, out + m);
}

#ifdef PD_AVX2
// The GEMM path's panel of rows n0..n0+cols (panel.h's Panel, q4k's own meaning of its fields):
// codes[(j * 8 + t) * kCols + col] = codes 4t..4t+3 (0..15) of sub-block j (panel.h's layout),
// slo[j * kCols + col] = sc_j, shi[(4 s + i) * kCols + col] = m_2i | m_2i+1 << 16 (int16 pairs of super-block s),
// dw / zw[s * kCols + col] = d / dmin; columns past `cols` are zero.
inline void unpack_panel(const uint8_t* qs, int64_t nb, int64_t n0, int cols, gemm::Panel& p) {
  using gemm::kCols;
  const int64_t nsb = nb / 8, row_bytes = nsb * kBytes;
  p.codes.resize(nb * 8 * kCols);
  p.dw.assign(nsb * kCols, 0.0f);
  p.zw.assign(nsb * kCols, 0.0f);
  p.slo.assign(nb * kCols, 0);
  p.shi.assign(nsb * 4 * kCols, 0);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int g = 0; g < kCols; g += 8) {
    for (int64_t j = 0; j < nb; ++j) {
      __m256i r[8];
      for (int c = 0; c < 8; ++c) {
        if (g + c >= cols) {
          r[c] = _mm256_setzero_si256();
          continue;
        }
        const uint8_t* sb = qs + (n0 + g + c) * row_bytes + j / 8 * kBytes;
        const __m256i v = _mm256_loadu_si256((const __m256i*)(sb + 16 + 32 * ((j % 8) / 2)));
        r[c] = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(j & 1 ? 4 : 0)), m4);
      }
      gemm::transpose8(r);
      int32_t* dst = p.codes.data() + j * 8 * kCols + g;
      for (int t = 0; t < 8; ++t) _mm256_storeu_si256((__m256i*)(dst + t * kCols), r[t]);
    }
  }
  for (int c = 0; c < cols; ++c) {
    const uint8_t* row = qs + (n0 + c) * row_bytes;
    for (int64_t s = 0; s < nsb; ++s) {
      panel_scales(row + s * kBytes, s, c, p);
    }
  }
}

// out[r * ldo + col] for activation rows m0..m0+R and the panel's first `cols` columns, 8 columns a vector
// (h = 0, 1): per sub-block 8 dot-product steps (isa.h's dot_u8s8), then I += sc * sums (vpmulld); per
// super-block J from four int16-pair multiply-adds of m against bs, then step's fp32 chain, lane-wise.
template <int R>
inline void gemm_tile(const gemm::Panel& p, const ActK& a, int64_t K, int64_t m0, float* out, int64_t ldo, int cols) {
  using gemm::kCols;
  const int64_t nsb = a.nsb;
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    __m256i I[R][2], J[R][2];
    for (int r = 0; r < R; ++r) I[r][0] = I[r][1] = J[r][0] = J[r][1] = _mm256_setzero_si256();
    for (int b = 0; b < 8; ++b) {
      const int64_t j = 8 * s + b;
      const int32_t* wp = p.codes.data() + j * 8 * kCols;
      __m256i sums[R][2];
      for (int r = 0; r < R; ++r) sums[r][0] = sums[r][1] = _mm256_setzero_si256();
      for (int t = 0; t < 8; ++t) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i*)(wp + t * kCols));
        const __m256i w1 = _mm256_loadu_si256((const __m256i*)(wp + t * kCols + 8));
        for (int r = 0; r < R; ++r) {
          int32_t word;
          std::memcpy(&word, a.q.data() + (m0 + r) * K + j * 32 + 4 * t, 4);
          const __m256i x = _mm256_set1_epi32(word);
          sums[r][0] = dot_u8s8(sums[r][0], w0, x);
          sums[r][1] = dot_u8s8(sums[r][1], w1, x);
        }
      }
      for (int h = 0; h < 2; ++h) {
        const __m256i sc = _mm256_loadu_si256((const __m256i*)(p.slo.data() + j * kCols + 8 * h));
        for (int r = 0; r < R; ++r) I[r][h] = _mm256_add_epi32(I[r][h], _mm256_mullo_epi32(sums[r][h], sc));
      }
    }
    for (int i = 0; i < 4; ++i)
      for (int h = 0; h < 2; ++h) {
        const __m256i mw = _mm256_loadu_si256((const __m256i*)(p.shi.data() + (4 * s + i) * kCols + 8 * h));
        for (int r = 0; r < R; ++r) {
          int32_t word;
          std::memcpy(&word, a.bs.data() + ((m0 + r) * nsb + s) * 8 + 2 * i, 4);
          J[r][h] = madd_acc(J[r][h], mw, _mm256_set1_epi32(word));
        }
      }
    for (int h = 0; h < 2; ++h) {
      const __m256 d = _mm256_loadu_ps(p.dw.data() + s * kCols + 8 * h), dm = _mm256_loadu_ps(p.zw.data() + s * kCols + 8 * h);
      for (int r = 0; r < R; ++r) {
        const __m256 dx = _mm256_set1_ps(a.d[(m0 + r) * nsb + s]);
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[r][h]), _mm256_mul_ps(d, dx), acc[r][h]);
        acc[r][h] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(J[r][h]), _mm256_mul_ps(dm, dx), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float res[kCols];
    _mm256_store_ps(res, acc[r][0]);
    _mm256_store_ps(res + 8, acc[r][1]);
    std::memcpy(out + r * ldo, res, cols * sizeof(float));
  }
}

#ifdef PD_AVX512
// The same tile with one zmm of all 16 columns (lane-wise the same operations, so the same bits)
template <int R>
inline void gemm_tile512(const gemm::Panel& p, const ActK& a, int64_t K, int64_t m0, float* out, int64_t ldo,
                         int cols) {
  using gemm::kCols;
  const int64_t nsb = a.nsb;
  __m512 acc[R];
  const int8_t* xrow[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm512_setzero_ps();
    xrow[r] = a.q.data() + (m0 + r) * K;
  }
  for (int64_t s = 0; s < nsb; ++s) {
    __m512i I[R], J[R];
    for (int r = 0; r < R; ++r) I[r] = J[r] = _mm512_setzero_si512();
    for (int b = 0; b < 8; ++b) {
      const int64_t j = 8 * s + b;
      const int32_t* wp = p.codes.data() + j * 8 * kCols;
      __m512i sums[R];
      for (int r = 0; r < R; ++r) sums[r] = _mm512_setzero_si512();
      for (int t = 0; t < 8; ++t) {
        const __m512i w = _mm512_loadu_si512((const void*)(wp + t * kCols));
        for (int r = 0; r < R; ++r) {
          int32_t word;
          std::memcpy(&word, xrow[r] + j * 32 + 4 * t, 4);
          sums[r] = _mm512_dpbusd_epi32(sums[r], w, _mm512_set1_epi32(word));
        }
      }
      const __m512i sc = _mm512_loadu_si512((const void*)(p.slo.data() + j * kCols));
      for (int r = 0; r < R; ++r) I[r] = _mm512_add_epi32(I[r], _mm512_mullo_epi32(sums[r], sc));
    }
    for (int i = 0; i < 4; ++i) {
      const __m512i mw = _mm512_loadu_si512((const void*)(p.shi.data() + (4 * s + i) * kCols));
      for (int r = 0; r < R; ++r) {
        int32_t word;
        std::memcpy(&word, a.bs.data() + ((m0 + r) * nsb + s) * 8 + 2 * i, 4);
        J[r] = _mm512_dpwssd_epi32(J[r], mw, _mm512_set1_epi32(word));
      }
    }
    const __m512 d = _mm512_loadu_ps(p.dw.data() + s * kCols), dm = _mm512_loadu_ps(p.zw.data() + s * kCols);
    for (int r = 0; r < R; ++r) {
      const __m512 dx = _mm512_set1_ps(a.d[(m0 + r) * nsb + s]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r]), _mm512_mul_ps(d, dx), acc[r]);
      acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(J[r]), _mm512_mul_ps(dm, dx), acc[r]);
    }
  }
  const __mmask16 keep = (__mmask16)((1u << cols) - 1);
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(out + r * ldo, keep, acc[r]);
}
#endif

template <int R = 1>
inline void rows_tail(const gemm::Panel& p, const ActK& a, int64_t K, int64_t m, int64_t left, float* out,
                      int64_t ldo, int cols) {
  if (left == R) {
#ifdef PD_AVX512
    return gemm_tile512<R>(p, a, K, m, out, ldo, cols);
#else
    return gemm_tile<R>(p, a, K, m, out, ldo, cols);
#endif
  }
  if constexpr (R + 1 < gemm::kRows) rows_tail<R + 1>(p, a, K, m, left, out, ldo, cols);
}

// out (M rows, stride ldo) = activation rows . the panel's columns
inline void panel_rows(const gemm::Panel& p, const ActK& a, int64_t K, int64_t M, float* out, int64_t ldo, int cols) {
  int64_t m = 0;
  for (; m + gemm::kRows <= M; m += gemm::kRows) {
#ifdef PD_AVX512
    gemm_tile512<gemm::kRows>(p, a, K, m, out + m * ldo, ldo, cols);
#else
    gemm_tile<gemm::kRows>(p, a, K, m, out + m * ldo, ldo, cols);
#endif
  }
  if (M > m) rows_tail(p, a, K, m, M - m, out + m * ldo, ldo, cols);
}
#endif

}  // namespace q4k
}  // namespace pagedeck
