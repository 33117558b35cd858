// The q4k and q5k formats' kernels: GGUF Q4_K and Q5_K super-blocks kept as the file stores them (kquant.h
// states the layouts and decodes them), per-row and GEMM paths, written once over the layout L (kquant.h's
// Q4K, Q5K): Q5_K is Q4_K with a plane of fifth bits, so its codes are the nibbles plus 16 where the bit is
// set (0..31: maddubs' int16 pairs stay under 2 * 31 * 127) and everything after the codes is the same.
//
// The arithmetic is llama.cpp's Q4_K x Q8_K: activations quantized per 256 (activations.h's quantize_k: one
// fp32 scale d_x a super-block, int8 codes, and bs_b = the integer sum of sub-block b's 32 codes), the 6-bit
// scales and minimums applied as integers,
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
// t[r] = I's partial sums of one super-block sb (4 int32 lanes whose sum is I = sum_b sc_b (q_b . x_b)) for
// activation rows r < MT, x: row m0's codes of the super-block, rows K apart; v: scales(sb). Per 32 nibble
// bytes c the low nibbles (sub-block 2c) meet x[64c : 64c+32], the high ones x[64c+32 : 64c+64]; maddubs gives
// int16 pairs (at most 2 * 15 * 127) and one madd with the sub-block's scale broadcast as int16 adds sc_b
// times them into int32 lanes. With AVX-512 the same integers from 512-bit registers: 64 nibble bytes (chunks
// 2k and 2k+1) a load, the low nibbles (sub-blocks 4k, 4k+2) meeting x[128k : +32] | x[128k+64 : +32], the
// high ones (4k+1, 4k+3) the other halves (the scale broadcasts one vpermw per register).
template <int MT, class L = Q4K>
inline void super_ints(const uint8_t* sb, __m128i v, const int8_t* x, int64_t K, __m128i t[MT]) {
#ifdef PD_AVX512
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  auto idx = [](int u, int w) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)u)), _mm256_set1_epi16((short)w), 1);
  };
  const __m512i ix[4] = {idx(0, 2), idx(1, 3), idx(4, 6), idx(5, 7)};
  const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(v));
  __m512i isum[MT];
  for (int r = 0; r < MT; ++r) isum[r] = _mm512_setzero_si512();
  for (int k = 0; k < 2; ++k) {
    const __m512i raw = _mm512_loadu_si512((const void*)(sb + L::kNibbles + 64 * k));
    __m512i lo = _mm512_and_si512(raw, m4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
    if constexpr (L::kHigh) {  // lo: sub-blocks 4k, 4k+2; hi: 4k+1, 4k+3
      const __m512i plane = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(sb + L::kHighAt)));
      lo = _mm512_or_si512(lo, high16(plane, 4 * k, 4 * k + 2));
      hi = _mm512_or_si512(hi, high16(plane, 4 * k + 1, 4 * k + 3));
    }
    const __m512i slo = _mm512_permutexvar_epi16(ix[2 * k], sc16), shi = _mm512_permutexvar_epi16(ix[2 * k + 1], sc16);
    for (int r = 0; r < MT; ++r) {
      const int8_t* xr = x + r * K + 128 * k;
      const __m512i x0 = _mm512_loadu_si512((const void*)xr), x1 = _mm512_loadu_si512((const void*)(xr + 64));
      const __m512i xl = _mm512_shuffle_i64x2(x0, x1, 0x44), xh = _mm512_shuffle_i64x2(x0, x1, 0xEE);
      isum[r] = _mm512_dpwssd_epi32(isum[r], _mm512_maddubs_epi16(lo, xl), slo);
      isum[r] = _mm512_dpwssd_epi32(isum[r], _mm512_maddubs_epi16(hi, xh), shi);
    }
  }
  for (int r = 0; r < MT; ++r) {
    const __m256i i8 = _mm256_add_epi32(_mm512_castsi512_si256(isum[r]), _mm512_extracti64x4_epi64(isum[r], 1));
    t[r] = _mm_add_epi32(_mm256_castsi256_si128(i8), _mm256_extracti128_si256(i8, 1));
  }
#else
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(v));
  __m256i isum[MT];
  for (int r = 0; r < MT; ++r) isum[r] = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    const __m256i raw = _mm256_loadu_si256((const __m256i*)(sb + L::kNibbles + 32 * c));
    __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    if constexpr (L::kHigh) {  // lo: sub-block 2c, hi: 2c+1
      const __m256i plane = _mm256_loadu_si256((const __m256i*)(sb + L::kHighAt));
      lo = _mm256_or_si256(lo, high16(plane, 2 * c));
      hi = _mm256_or_si256(hi, high16(plane, 2 * c + 1));
    }
    const __m256i slo = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)((4 * c + 1) << 8 | 4 * c)));
    const __m256i shi = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)((4 * c + 3) << 8 | (4 * c + 2))));
    for (int r = 0; r < MT; ++r) {  // two independent madds a chunk: no 8-deep dpwssd latency chain
      const int8_t* xr = x + r * K + 64 * c;
      const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i*)xr)), slo);
      const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i*)(xr + 32))), shi);
      isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(p0, p1));
    }
  }
  for (int r = 0; r < MT; ++r) t[r] = _mm_add_epi32(_mm256_castsi256_si128(isum[r]), _mm256_extracti128_si256(isum[r], 1));
#endif
}

// out[r] = weight row . activation rows m0..m0+MT: per super-block the exact I (super_ints) and J (the
// minimums against the activations' sub-block sums bs), then step's fp32 chain.
template <int MT, class L = Q4K>
inline void tile(const uint8_t* row, int64_t nsb, const ActK& a, int64_t K, int64_t m0, float* out) {
  float acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = 0.0f;
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = row + s * L::kBytes;
    prefetch_super<L>(sb);
    const __m128i v = scales(sb);
    const __m128i mn16 = _mm_cvtepu8_epi16(_mm_srli_si128(v, 8));
    __m128i isum[MT];
    super_ints<MT, L>(sb, v, a.q.data() + m0 * K + s * kSuper, K, isum);
    const float d = half_at(sb), dmin = half_at(sb + 2);
    for (int r = 0; r < MT; ++r) {
      const int64_t at = (m0 + r) * nsb + s;
      const __m128i bs = _mm_loadu_si128((const __m128i*)(a.bs.data() + at * 8));
      __m128i t = _mm_hadd_epi32(isum[r], _mm_madd_epi16(bs, mn16));  // [I01, I23, J01, J23]
      t = _mm_hadd_epi32(t, t);                                        // [I, J, I, J]
      acc[r] = step(acc[r], _mm_cvtsi128_si32(t), _mm_extract_epi32(t, 1), d, dmin, a.d[at]);
    }
  }
  for (int r = 0; r < MT; ++r) out[r] = acc[r];
}
#else  // the portable loops: the same integers and chain, one code at a time
template <int MT, class L = Q4K>
inline void tile(const uint8_t* row, int64_t nsb, const ActK& a, int64_t K, int64_t m0, float* out) {
  for (int r = 0; r < MT; ++r) {
    float acc = 0.0f;
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* sb = row + s * L::kBytes;
      uint8_t sm[16];
      scale_mins(sb, sm);
      const int64_t at = (m0 + r) * nsb + s;
      int32_t I = 0, J = 0;
      for (int b = 0; b < 8; ++b) {
        int32_t dot = 0;
        for (int i = 0; i < 32; ++i) dot += code<L>(sb, 32 * b + i) * a.q[(m0 + r) * K + s * kSuper + 32 * b + i];
        I += sm[b] * dot;
        J += sm[8 + b] * a.bs[at * 8 + b];
      }
      acc = step(acc, I, J, half_at(sb), half_at(sb + 2), a.d[at]);
    }
    out[r] = acc;
  }
}
#endif

// out[m] = weight row n . activation row m, 4 activation rows sharing each unpacked super-block
template <class L = Q4K>
inline void weight_row(const uint8_t* qs, int64_t K, const ActK& a, int64_t M, int64_t n, float* out) {
  const int64_t nsb = K / kSuper;
  const uint8_t* row = qs + n * nsb * L::kBytes;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile<4, L>(row, nsb, a, K, m, out + m);
  for (; m < M; ++m) tile<1, L>(row, nsb, a, K, m, out + m);
}

#ifdef PD_AVX2
// The GEMM path's panel of rows n0..n0+cols (panel.h's Panel, q4k's own meaning of its fields):
// codes[(j * 8 + t) * kCols + col] = codes 4t..4t+3 (0..15, Q5_K 0..31) of sub-block j (panel.h's layout),
// slo[j * kCols + col] = sc_j, shi[(4 s + i) * kCols + col] = m_2i | m_2i+1 << 16 (int16 pairs of super-block s),
// dw / zw[s * kCols + col] = d / dmin; columns past `cols` are zero.
template <class L = Q4K>
inline void unpack_panel(const uint8_t* qs, int64_t nb, int64_t n0, int cols, gemm::Panel& p) {
  using gemm::kCols;
  const int64_t nsb = nb / 8, row_bytes = nsb * L::kBytes;
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
        const uint8_t* sb = qs + (n0 + g + c) * row_bytes + j / 8 * L::kBytes;
        const __m256i v = _mm256_loadu_si256((const __m256i*)(sb + L::kNibbles + 32 * ((j % 8) / 2)));
        r[c] = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(j & 1 ? 4 : 0)), m4);
        if constexpr (L::kHigh)
          r[c] = _mm256_or_si256(r[c], high16(_mm256_loadu_si256((const __m256i*)(sb + L::kHighAt)), (int)(j % 8)));
      }
      gemm::transpose8(r);
      int32_t* dst = p.codes.data() + j * 8 * kCols + g;
      for (int t = 0; t < 8; ++t) _mm256_storeu_si256((__m256i*)(dst + t * kCols), r[t]);
    }
  }
  for (int c = 0; c < cols; ++c) {
    const uint8_t* row = qs + (n0 + c) * row_bytes;
    for (int64_t s = 0; s < nsb; ++s) {
      panel_scales(row + s * L::kBytes, s, c, p);
    }
  }
}

// out[r * ldo + col] for activation rows m0..m0+R and the panel's first `cols` columns, all 16 columns a
// vector (panel.h's Cols16: one zmm, or two ymm): per sub-block 8 dot-product steps, then I += sc * sums
// (vpmulld); per super-block J from four int16-pair multiply-adds of m against bs, then step's fp32 chain,
// lane-wise.
template <int R>
inline void gemm_tile(const gemm::Panel& p, const ActK& a, int64_t K, int64_t m0, float* out, int64_t ldo, int cols) {
  using gemm::kCols;
  const int64_t nsb = a.nsb;
  auto ints = [&](int64_t s, const int8_t* const* xrow, gemm::Cols16* I) {
    for (int64_t j = 8 * s; j < 8 * s + 8; ++j)
      gemm::sub_block<R, 8>(
          p.codes.data() + j * 8 * kCols, xrow, 32 * j, p.slo.data() + j * kCols, [](int) { return gemm::zero16(); },
          [](gemm::Cols16 acc, gemm::Cols16 w, int32_t x) { return gemm::dot16(acc, w, x); }, I);
  };
  auto minimums = [&](int64_t s, gemm::Cols16f* acc) {  // acc -= J * (dmin * dx), J = sum_b m_b bs_b
    gemm::minimum_step<R>(p.shi.data() + 4 * s * kCols, 4, a.bs.data(), a.d.data(), nsb, m0, s, p.zw.data() + s * kCols,
                          acc);
  };
  gemm::superblock_tile<R>(a.q.data(), a.d.data(), p.dw.data(), K, nsb, m0, out, ldo, cols, ints, minimums);
}
#endif

}  // namespace q4k
}  // namespace pagedeck
