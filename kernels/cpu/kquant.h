// The K-quant family's super-blocks, as GGUF stores them, and their decoding, shared by every kernel that
// reads them: the per-row kernels (q4k.h, q4k16.h, q6.h), the GEMM panels (q4k.h, q4k16.h, q6.h) and the
// packing (repack.cpp). 256 weights a super-block:
//   Q4_K (q4k): 144 bytes: fp16 d and dmin, 12 bytes of 6-bit scales sc and minimums m per 32, 128 bytes of
//     nibbles, the low nibbles of bytes 32c..32c+31 being sub-block 2c and the high ones sub-block 2c+1;
//     w = d sc q - dmin m.
//   Q5_K (q5k): 176 bytes: Q4_K's fp16 d and dmin and 12 scale bytes, then 32 bytes qh of fifth bits (bit b
//     of qh[t] is weight t of sub-block b's 16), then Q4_K's 128 bytes of nibbles; code 0..31, w = d sc q -
//     dmin m. Its kernels are q4k's, read through the layout (q4k::Q5K) with the fifth-bit plane added.
//   Q6_K (q6): 210 bytes: 128 bytes of low nibbles, 64 of high 2-bit pairs, sixteen int8 scales, fp16 d;
//     w = d sc[i / 16] (q - 32).
//   Q3_K (q3k): 110 bytes: 32 bytes hmask of third bits, 64 of 2-bit pairs, 12 bytes of sixteen 6-bit scales,
//     fp16 d; code 0..7 (the third bit set: + 4), w = d (sc[i / 16] - 32) (q - 4). Its kernels are q6's, read
//     through its layout (q6.h's Q3K).
//   Q2_K (q2k): 84 bytes: sixteen bytes of a 4-bit scale and a 4-bit minimum per 16 weights, Q3_K's 64 bytes
//     of 2-bit pairs, fp16 d and dmin; w = d sc[i / 16] q - dmin m[i / 16]. Its kernels are q6's too (q6.h's
//     Q2K), with q4k's step for the minimums.
#pragma once

#include "common.h"
#include "panel.h"

namespace pagedeck {
namespace q4k {

constexpr int64_t kSuper = 256, kBytes = 144;

// The two super-block layouts q4k.h's kernels read, both with d, dmin and the 12 scale bytes first:
// Q4_K's nibbles follow them; Q5_K puts its 32 bytes of fifth bits (kHigh) there and the nibbles after.
struct Q4K {
  static constexpr int64_t kBytes = 144, kNibbles = 16;
  static constexpr bool kHigh = false;
};
struct Q5K {
  static constexpr int64_t kBytes = 176, kNibbles = 48, kHighAt = 16;
  static constexpr bool kHigh = true;
};

// the eight 6-bit scales (out[0..7]) and minimums (out[8..15]) of a super-block (ggml's get_scale_min_k4)
inline void scale_mins(const uint8_t* sb, uint8_t out[16]) {
  const uint8_t* q = sb + 4;
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      out[j] = q[j] & 63;
      out[8 + j] = q[j + 4] & 63;
    } else {
      out[j] = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
      out[8 + j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
  }
}

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

// code (0..15 for Q4_K, 0..31 for Q5_K) of weight i of one super-block
template <class L = Q4K>
inline int code(const uint8_t* sb, int i) {
  const int b = i / 32, t = i % 32;
  const uint8_t v = sb[L::kNibbles + 32 * (b / 2) + t];
  const int low = (b & 1) ? (v >> 4) : (v & 0x0F);
  if constexpr (L::kHigh) return low | (((sb[L::kHighAt + t] >> b) & 1) << 4);
  return low;
}
// The fp32 chain every output element of a q4k product runs, one step a super-block (every path): the exact
// integers I = sum_b sc_b (q_b . x_b) and J = sum_b m_b bs_b met by d d_x and dmin d_x (q4k.h's top comment)
inline float step(float acc, int32_t I, int32_t J, float d, float dmin, float dx) {
  acc = std::fma((float)I, d * dx, acc);
  return std::fma(-(float)J, dmin * dx, acc);
}

#ifdef PD_AVX2
// kPrefetch bytes ahead, every line of a super-block's 144 bytes: one line a super-block left 56 % of the lines
// to the hardware prefetchers (the kernel read ~14 GB/s from DRAM on two cores where q8 reads ~30)
template <class L = Q4K>
inline void prefetch_super(const uint8_t* sb) {
  for (int b = 0; b < L::kBytes; b += 64) _mm_prefetch((const char*)(sb + kPrefetch + b), _MM_HINT_T0);
}

// Q5_K's fifth bits as 16s: for each byte t of `plane` (qh[t] in both halves of a vector), 16 where bit `b` of
// it is set (the halves may ask different bits: 512-bit `bits` holds one mask a half)
inline __m256i high16(__m256i plane, int b) {
  const __m256i one = _mm256_set1_epi8(1);
  return _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(plane, _mm_cvtsi32_si128(b)), one), 4);
}
#ifdef PD_AVX512
inline __m512i high16(__m512i plane, int b_lo, int b_hi) {
  const __m512i bits = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << b_lo)), _mm256_set1_epi8((char)(1 << b_hi)), 1);
  return _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(plane, bits), _mm512_set1_epi8(16));
}
#endif

// the super-block's sc0..7 (bytes 0..7) and m0..7 (bytes 8..15), ggml's kmask regrouping without a store
inline __m128i scales(const uint8_t* sb) {
  constexpr uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
  uint32_t u[3];
  std::memcpy(u, sb + 4, 12);
  const uint32_t m47 = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
  const uint32_t m03 = u[1] & k1;
  const uint32_t s47 = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
  return _mm_set_epi32((int)m47, (int)m03, (int)s47, (int)(u[0] & k1));
}

// A GEMM panel's scale fields of column col for super-block s (sb: its first 16 bytes, d, dmin and the scale
// bytes): dw / zw = d / dmin, slo[8 s + b] = sc_b, shi[4 s + i] = m_2i | m_2i+1 << 16 (int16 pairs)
inline void panel_scales(const uint8_t* sb, int64_t s, int col, gemm::Panel& p) {
  using gemm::kCols;
  uint8_t sm[16];
  scale_mins(sb, sm);
  p.dw[s * kCols + col] = half_at(sb);
  p.zw[s * kCols + col] = half_at(sb + 2);
  for (int b = 0; b < 8; ++b) p.slo[(8 * s + b) * kCols + col] = sm[b];
  for (int i = 0; i < 4; ++i) p.shi[(4 * s + i) * kCols + col] = sm[8 + 2 * i] | (int32_t)sm[9 + 2 * i] << 16;
}
#endif

}  // namespace q4k

namespace q6 {

constexpr int64_t kSuper = 256, kBytes = 210;

// code (0..63) of weight i of one super-block
inline int code(const uint8_t* sb, int i) {
  const int n = i / 128, l = i % 128, k = l / 32, t = l % 32;
  const uint8_t* ql = sb + 64 * n + 32 * (k & 1);
  const int low = (k < 2) ? (ql[t] & 0x0F) : (ql[t] >> 4);
  return low | (((sb[128 + 32 * n + t] >> (2 * k)) & 3) << 4);
}

inline float scale_d(const uint8_t* sb) {
  uint16_t h;
  std::memcpy(&h, sb + 208, 2);
  return half_to_float(h);
}

#ifdef PD_AVX2
// byte shuffles turning sixteen int8 scales into block b's [sc[2b] x 8, sc[2b+1] x 8]
inline __m128i scale_shuffle(int b) {
  return _mm_set_epi8(2 * b + 1, 2 * b + 1, 2 * b + 1, 2 * b + 1, 2 * b + 1, 2 * b + 1, 2 * b + 1, 2 * b + 1, 2 * b,
                      2 * b, 2 * b, 2 * b, 2 * b, 2 * b, 2 * b, 2 * b);
}

// c[k] = the 32 codes (0..63) of block 4n + k of a super-block, k = 0..3, from three 32-byte loads: the low
// nibbles of bytes 64n..64n+63 and their 2-bit pairs in bytes 128 + 32n..
inline void half_codes(const uint8_t* sb, int n, __m256i c[4]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
  const __m256i q0 = _mm256_loadu_si256((const __m256i*)(sb + 64 * n));
  const __m256i q1 = _mm256_loadu_si256((const __m256i*)(sb + 64 * n + 32));
  const __m256i h = _mm256_loadu_si256((const __m256i*)(sb + 128 + 32 * n));
  c[0] = _mm256_or_si256(_mm256_and_si256(q0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
  c[1] = _mm256_or_si256(_mm256_and_si256(q1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4));
  c[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q0, 4), m4),
                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4));
  c[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q1, 4), m4),
                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4));
}
#endif

}  // namespace q6

namespace q2k {

constexpr int64_t kSuper = 256, kBytes = 84;
constexpr int kScales = 0, kQs = 16, kD = 80, kDmin = 82;

// code (0..3) of weight i = 128 n + 32 j + l of a super-block of 2-bit pairs at `qs`: bits 2j of byte 32 n + l
inline int pair(const uint8_t* qs, int i) { return (qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3; }

#ifdef PD_AVX2
// c[j] = the 32 codes (0..3) of block 4n + j, j = 0..3, from the 32 pair bytes of half n at `qs`
inline void half_pairs(const uint8_t* qs, int n, __m256i c[4]) {
  const __m256i m2 = _mm256_set1_epi8(0x03);
  const __m256i q = _mm256_loadu_si256((const __m256i*)(qs + 32 * n));
  for (int j = 0; j < 4; ++j) c[j] = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), m2);
}
#endif

}  // namespace q2k

namespace q3k {

constexpr int64_t kSuper = 256, kBytes = 110;
constexpr int kHmask = 0, kQs = 32, kScales = 96, kD = 108;

// code (0..7) of weight i = 128 n + 32 j + l of one super-block: bits 2j of byte 32 n + l of the pairs, bit
// 4n + j of hmask byte l the third (gguf's "minus 4 where clear", as an offset of 4 on every code)
inline int code(const uint8_t* sb, int i) {
  return q2k::pair(sb + kQs, i) | (((sb[kHmask + i % 32] >> (4 * (i / 128) + (i % 128) / 32)) & 1) << 2);
}

// scale h (of weights 16h..16h+15), -32..31: the low nibble of byte h (h < 8) or h - 8 (its high nibble), the
// high two bits at 2 (h / 4) of byte 8 + h % 4 (ggml's kmask regrouping)
inline int8_t scale(const uint8_t* sb, int h) {
  const uint8_t* q = sb + kScales;
  const int low = h < 8 ? q[h] & 0x0F : q[h - 8] >> 4;
  return (int8_t)((low | ((q[8 + h % 4] >> (2 * (h / 4))) & 3) << 4) - 32);
}

inline float scale_d(const uint8_t* sb) {
  uint16_t h;
  std::memcpy(&h, sb + kD, 2);
  return half_to_float(h);
}

#ifdef PD_AVX2
// the sixteen scales (-32..31) as int8, scale(sb, h) in byte h
inline __m128i scales16(const uint8_t* sb) {
  constexpr uint32_t k2 = 0x0f0f0f0f, k3 = 0x03030303;
  uint32_t u[3];
  std::memcpy(u, sb + kScales, 12);
  const __m128i v = _mm_set_epi32((int)(((u[1] >> 4) & k2) | (((u[2] >> 6) & k3) << 4)),
                                  (int)(((u[0] >> 4) & k2) | (((u[2] >> 4) & k3) << 4)),
                                  (int)((u[1] & k2) | (((u[2] >> 2) & k3) << 4)), (int)((u[0] & k2) | ((u[2] & k3) << 4)));
  return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

// c[j] = the 32 codes (0..7) of block 4n + j of a super-block, j = 0..3, from two 32-byte loads: the pairs of
// bytes 32 + 32n.. (Q2_K's) and the third bits of hmask
inline void half_codes(const uint8_t* sb, int n, __m256i c[4]) {
  const __m256i one = _mm256_set1_epi8(1);
  const __m256i h = _mm256_loadu_si256((const __m256i*)(sb + kHmask));
  q2k::half_pairs(sb + kQs, n, c);
  for (int j = 0; j < 4; ++j) {
    const __m256i third = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(4 * n + j)), one);
    c[j] = _mm256_or_si256(c[j], _mm256_slli_epi16(third, 2));
  }
}
#endif

}  // namespace q3k
}  // namespace pagedeck
