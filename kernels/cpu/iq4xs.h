// The iq4xs format's arithmetic (GGUF IQ4_XS, lut4.h's super-block member: fp16 d, eight 6-bit sub-block scales
// ls, 4-bit codes into the IQ4_NL table): llama.cpp's IQ4_XS x Q8_K. Activations quantized per 256
// (activations.h's quantize_k: one fp32 scale d_x a super-block, int8 codes x, bs_b = the integer sum of
// sub-block b's 32 codes), the sub-block scales applied as integers, the whole super-block one exact int32
//   I = sum_b (ls_b - 32) (v_b . x_b)      (|I| <= 8 * 32 * 32 * 127 * 127 < 2^31; v the table values)
// and fp32 once a super-block: acc = fma(I, d d_x, acc), the result the last acc. An fp32 scale per 32
// activations would cost every 32 weights and activation row a conversion, a multiply and an fma on the pipes
// of the block's dpbusd. The codes meet the activations as lut4.h's do (u = v + 128 through dpbusd, taking
// 128 bs_b out; |v| sign(x, v) on AVX2 without VNNI). The per-row path (tile), the 16-row groups (iq4xs16.h)
// and the GEMM path (gemm_tile, over panels from unpack_panel or iq4xs16.h's) build the same integers and run
// this one fp32 chain per output element, so their bits are the same for any batch, row order or thread count.
#pragma once

#include "activations.h"
#include "common.h"
#include "lut4.h"
#include "panel.h"

namespace pagedeck {
namespace iq4xs {

using B = lut4::Iq4xs;
constexpr int64_t kSuper = 256;

// one super-block's step of an output element's chain
inline float step(float acc, int32_t I, float d, float dx) { return std::fma((float)I, d * dx, acc); }

#ifdef PD_AVX2
// Super-block sb's eight sub-block scales ls - 32 (-32..31) as int32 lanes: block b's low 4 bits are nibble b of
// the low word (byte b / 2, low nibble first), its high 2 bits bits 2b of the high half-word
inline __m256i scales(const uint8_t* sb) {
  uint16_t high;
  uint32_t low;
  std::memcpy(&high, sb + 2, 2);
  std::memcpy(&low, sb + 4, 4);
  const __m256i nibble = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i pair = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)low), nibble), _mm256_set1_epi32(0x0F));
  const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(high), pair), _mm256_set1_epi32(3));
  return _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
}

// out[r] = weight row `row` (nsb super-blocks) . activation rows m0..m0+MT: per super-block the 8 blocks' codes
// looked up once, each row's 8 exact block sums (lut4.h's reduction), then I = the sum of their products with
// the sub-block scales, then step.
template <int MT>
inline void tile(const uint8_t* row, int64_t nsb, const ActK& a, int64_t K, int64_t m0, float* out) {
  const __m256i tab = lut4::table<B>();
  float acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = 0.0f;
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = row + s * B::kBytes;
    for (int64_t b = 0; b < B::kBytes; b += 64) _mm_prefetch((const char*)sb + kPrefetch + b, _MM_HINT_T0);
    const __m256i ls = scales(sb);
    const float d = lut4::half_at(sb);
#ifdef PD_AVX512
    const __m512i tab512 = _mm512_broadcast_i32x4(_mm256_castsi256_si128(tab));
    __m512i c[4];
    lut4::nibble_codes8<B>(row, 8 * s, tab512, c);
#else
    __m256i c[8];
    for (int k = 0; k < 8; ++k) c[k] = lut4::block_values<B>(row, 8 * s + k, tab);
#endif
    for (int r = 0; r < MT; ++r) {
      const int8_t* x = a.q.data() + (m0 + r) * K + s * kSuper;
      const int64_t at = (m0 + r) * nsb + s;
#ifdef PD_AVX512
      __m512i p[4];
      for (int k = 0; k < 4; ++k)
        p[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[k], _mm512_loadu_si512((const void*)(x + 64 * k)));
      __m256i sums = lut4::block_sums8(p);
#else
      __m256i p[8];
      for (int k = 0; k < 8; ++k) p[k] = q8::dot(c[k], _mm256_loadu_si256((const __m256i*)(x + 32 * k)));
      __m256i sums = lut4::block_sums8(p);
#endif
      if (kVnni) {  // u x - 128 x: the block sums of v x
        const __m256i bs = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i*)(a.bs.data() + 8 * at)));
        sums = _mm256_sub_epi32(sums, _mm256_slli_epi32(bs, 7));
      }
      acc[r] = step(acc[r], hsum_i32(_mm256_mullo_epi32(sums, ls)), d, a.d[at]);
    }
  }
  for (int r = 0; r < MT; ++r) out[r] = acc[r];
}

// The GEMM path's panel of weight rows n0..n0+cols (panel.h's Panel, iq4xs's meaning of its fields): codes the
// table values u8 v + 128 ([block][4-byte step][column]), slo[j * kCols + col] = block j's ls - 32, dw[s * kCols
// + col] = super-block s's d; columns past `cols` are zero.
inline void unpack_panel(const uint8_t* qs, int64_t nb, int64_t n0, int cols, gemm::Panel& p) {
  using gemm::kCols;
  const int64_t nsb = nb / 8, row_bytes = nsb * B::kBytes;
  lut4::unpack_codes<B>(qs, nb, n0, cols, p);
  p.dw.assign(nsb * kCols, 0.0f);
  p.zw.clear();
  p.slo.assign(nb * kCols, 0);
  p.shi.clear();
  for (int c = 0; c < cols; ++c) {
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* sb = qs + (n0 + c) * row_bytes + s * B::kBytes;
      alignas(32) int32_t ls[8];
      _mm256_store_si256((__m256i*)ls, scales(sb));
      p.dw[s * kCols + c] = lut4::half_at(sb);
      for (int b = 0; b < 8; ++b) p.slo[(s * 8 + b) * kCols + c] = ls[b];
    }
  }
}

// out[r * ldo + col] for activation rows m0..m0+R and the panel's first `cols` columns, all 16 columns a vector
// (panel.h's Cols16): per block 8 dot-product steps (dot16_q8; with VNNI from -128 bs_b), so that it ends at
// v_b . x_b, then I += (ls_b - 32) times it (vpmulld); per super-block step's fp32 chain, lane-wise.
template <int R>
inline void gemm_tile(const gemm::Panel& p, const ActK& a, int64_t K, int64_t m0, float* out, int64_t ldo, int cols) {
  const int64_t nsb = a.nsb;
  auto ints = [&](int64_t s, const int8_t* const* xrow, gemm::Cols16* I) {
    for (int64_t j = 8 * s; j < 8 * s + 8; ++j)  // block j: its sum from -128 bs_j with VNNI
      gemm::sub_block<R, 8>(
          p.codes.data() + j * 8 * gemm::kCols, xrow, 32 * j, p.slo.data() + j * gemm::kCols,
          [&](int r) { return gemm::set16(kVnni ? -128 * (int32_t)a.bs[(m0 + r) * nsb * 8 + j] : 0); },
          [](gemm::Cols16 acc, gemm::Cols16 w, int32_t x) { return gemm::dot16_q8(acc, w, x); }, I);
  };
  gemm::superblock_tile<R>(a.q.data(), a.d.data(), p.dw.data(), K, nsb, m0, out, ldo, cols, ints,
                           [](int64_t, gemm::Cols16f*) {});
}
#else  // portable: the same integers and chain, one code at a time
// I of super-block sb against its 256 activation codes x
inline int32_t super_int(const uint8_t* sb, const int8_t* x) {
  uint16_t high;
  std::memcpy(&high, sb + 2, 2);
  int32_t I = 0;
  for (int b = 0; b < 8; ++b) {
    const int ls = ((sb[4 + b / 2] >> (4 * (b % 2))) & 0x0F) | (((high >> (2 * b)) & 3) << 4);
    int32_t dot = 0;
    for (int i = 0; i < 32; ++i) dot += lut4::value<B>(sb, b, i) * x[32 * b + i];
    I += (ls - 32) * dot;
  }
  return I;
}

template <int MT>
inline void tile(const uint8_t* row, int64_t nsb, const ActK& a, int64_t K, int64_t m0, float* out) {
  for (int r = 0; r < MT; ++r) {
    float acc = 0.0f;
    for (int64_t s = 0; s < nsb; ++s) {
      const int32_t I = super_int(row + s * B::kBytes, a.q.data() + (m0 + r) * K + s * kSuper);
      acc = step(acc, I, lut4::half_at(row + s * B::kBytes), a.d[(m0 + r) * nsb + s]);
    }
    out[r] = acc;
  }
}
#endif

// out[m] = weight row n . activation row m, 4 activation rows sharing each super-block's looked-up codes
inline void weight_row(const uint8_t* qs, int64_t K, const ActK& a, int64_t M, int64_t n, float* out) {
  const int64_t nsb = K / kSuper;
  const uint8_t* row = qs + n * nsb * B::kBytes;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile<4>(row, nsb, a, K, m, out + m);
  for (; m < M; ++m) tile<1>(row, nsb, a, K, m, out + m);
}

}  // namespace iq4xs
}  // namespace pagedeck
