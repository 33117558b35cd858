// The affine nibble family, w = d q + m per block of 32 with fp16 d and m in scale and minimum tensors beside
// the codes: q4 (GGUF Q4_0 / Q4_1: 16 bytes of nibbles a block, the low nibbles weights 0..15, the high ones
// 16..31; Q4_0 is m = -8 d) and q5 below. Their products are centred (qmatmul.cpp's top comment): rows.h's
// per-row tile and qgemm.h's tiles run both, with the codes this header decodes.
//
// q5: GGUF Q5_0 / Q5_1 weights, w = d * q + m with 5-bit codes q (0..31; Q5_0 is m = -16 d), d and m fp16 per
// block of 32 in q4's scale and minimum buffers. Held at 5 bits a weight instead of re-quantized to q8 (8.5):
// a Q5_0 matrix's decode step reads 0.65x the bytes.
//
// A row is its blocks in pairs, 40 bytes a pair: both blocks' 16 nibble bytes (q4's order: low nibbles are
// weights 0..15, high ones 16..31) and then 8 bytes of fifth bits, as 16-bit words [j: bits 0..15, j+1: bits
// 0..15, j: bits 16..31, j+1: bits 16..31]. One 32-byte load of the pair's nibbles (q4's pair load) then
// meets its fifth bits as one 64-bit word: the low half belongs to the low nibbles, the high half to the high
// ones. An odd last block is its 16 nibble bytes and its 32 bits in the file's order. 20 bytes a block, so
// block j of a row starts at j * kBytes either way (engine.model.packing.repack writes the layout, q5_codes reads it).
//
// The products are q4's (qmatmul.cpp's dot_tile, qgemm.h's tiles) with the codes widened and centred at 16
// instead of 8: w = d (q - 16) + z, z = m + 16 d meets the exact block sum of x and the int8 sum meets -16 d,
// so the activation rounding meets d (q - 16) alone, as in llama.cpp's Q5_0 x Q8_0 dot product.
#pragma once

#include "common.h"
#include "panel.h"

namespace pagedeck {
namespace q4 {

#ifdef PD_AVX2
// the 32 codes (0..15) of the 16 nibble bytes at p, in weight order
inline __m256i codes(const uint8_t* p) {
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m128i raw = _mm_loadu_si128((const __m128i*)p);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
}
#endif

#ifdef PD_AVX512
// q4 codes of block j of 16 full columns: word t < 4 of a column = the low nibbles of its raw dword t, word
// t + 4 the high ones.
inline void unpack_block16(const uint8_t* qs, int64_t nb, int64_t n0, int64_t j, int32_t* dst) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512i T[4];
  gemm::words16(qs + (n0 * nb + j) * 16, nb * 16, T);
  for (int t = 0; t < 4; ++t) {
    _mm512_storeu_si512((void*)(dst + t * gemm::kCols), _mm512_and_si512(T[t], low));
    _mm512_storeu_si512((void*)(dst + (t + 4) * gemm::kCols), _mm512_and_si512(_mm512_srli_epi16(T[t], 4), low));
  }
}
#endif

}  // namespace q4

namespace q5 {

constexpr int64_t kBytes = 20;  // bytes a block: 16 of nibbles, 4 of fifth bits
// The centre of a nibble format's codes (q4: 8, q5: 16); the activations carry c = 8 d_x isum, which q5 doubles.
constexpr float centre(bool is_q5) { return is_q5 ? 16.0f : 8.0f; }

// block j's nibble bytes in a row
inline const uint8_t* nibbles(const uint8_t* row, int64_t j) { return row + (j & ~int64_t(1)) * kBytes + 16 * (j & 1); }

// block j's fifth bits, bit i for weight i
inline uint32_t fifth_bits(const uint8_t* row, int64_t nb, int64_t j) {
  uint32_t h;
  if ((j & 1) == 0 && j + 1 == nb) {  // an odd last block: the file's word
    std::memcpy(&h, row + j * kBytes + 16, 4);
    return h;
  }
  const uint8_t* hb = row + (j & ~int64_t(1)) * kBytes + 32;
  uint16_t lo, hi;
  std::memcpy(&lo, hb + 2 * (j & 1), 2);
  std::memcpy(&hi, hb + 4 + 2 * (j & 1), 2);
  return (uint32_t)lo | (uint32_t)hi << 16;
}

// code i (0..31) of block j of a row
inline int code(const uint8_t* row, int64_t nb, int64_t j, int i) {
  const uint8_t b = nibbles(row, j)[i & 15];
  return (i < 16 ? (b & 15) : (b >> 4)) | (int)((fifth_bits(row, nb, j) >> i) & 1) << 4;
}

#ifdef PD_AVX2
// 32 bytes, byte i = 16 where bit i of h is set, else 0
inline __m256i spread(uint32_t h) {
#ifdef PD_AVX512_BYTES
  return _mm256_maskz_mov_epi8((__mmask32)h, _mm256_set1_epi8(16));
#else
  const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3,
                                        3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
  const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), pick), bit);
  return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(16));
#endif
}

// the 32 codes of block j of a row, in weight order
inline __m256i codes(const uint8_t* row, int64_t nb, int64_t j) {
  return _mm256_or_si256(q4::codes(nibbles(row, j)), spread(fifth_bits(row, nb, j)));
}
#endif

#ifdef PD_AVX512
// q5 codes of block j of 16 full columns: q4's nibble words (words16 on the nibble bytes) plus 16 where a
// weight's fifth bit is set. Each column's 32 fifth bits are gathered into its lane (two dword gathers inside
// the pair's 8 bytes of bits), byte k of every lane is repeated over the lane's 4 bytes, and per code word w
// (weights 4w..4w+3: half of byte w / 2) one vptestmb gives the byte mask that one masked vpaddb adds 16 under.
// The same codes as codes(), transposed (kernels/PERF.md: the q5 share of an 8-row decode step).
inline void unpack_block16(const uint8_t* qs, int64_t nb, int64_t n0, int64_t j, int32_t* dst) {
  const int64_t st = nb * kBytes;
  const uint8_t* row0 = qs + n0 * st;
  const __m512i low = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
  __m512i T[4], c[8];
  gemm::words16(nibbles(row0, j), st, T);
  for (int t = 0; t < 4; ++t) {
    c[t] = _mm512_and_si512(T[t], low);
    c[t + 4] = _mm512_and_si512(_mm512_srli_epi16(T[t], 4), low);
  }
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32((int)st));
  __m512i h;
  if ((j & 1) == 0 && j + 1 == nb) {  // an odd last block: the file's word
    h = _mm512_i32gather_epi32(idx, (const void*)(row0 + j * kBytes + 16), 1);
  } else {  // the pair's words [j lo, j+1 lo] and [j hi, j+1 hi] (above)
    const uint8_t* hb = row0 + (j & ~int64_t(1)) * kBytes + 32;
    const __m512i lo = _mm512_i32gather_epi32(idx, (const void*)hb, 1);
    const __m512i hi = _mm512_i32gather_epi32(idx, (const void*)(hb + 4), 1);
    const __m512i half = _mm512_set1_epi32(0xFFFF);
    h = (j & 1) ? _mm512_or_si512(_mm512_srli_epi32(lo, 16), _mm512_andnot_si512(half, hi))
                : _mm512_or_si512(_mm512_and_si512(lo, half), _mm512_slli_epi32(hi, 16));
  }
  const __m512i lanes = _mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0);
  const __m512i bits_lo = _mm512_set1_epi32(0x08040201), bits_hi = _mm512_set1_epi32((int)0x80402010);
  for (int k = 0; k < 4; ++k) {
    const __m512i rep = _mm512_shuffle_epi8(h, _mm512_add_epi8(lanes, _mm512_set1_epi8((char)k)));
    c[2 * k] = _mm512_mask_add_epi8(c[2 * k], _mm512_test_epi8_mask(rep, bits_lo), c[2 * k], sixteen);
    c[2 * k + 1] = _mm512_mask_add_epi8(c[2 * k + 1], _mm512_test_epi8_mask(rep, bits_hi), c[2 * k + 1], sixteen);
  }
  for (int w = 0; w < 8; ++w) _mm512_storeu_si512((void*)(dst + w * gemm::kCols), c[w]);
}
#endif

}  // namespace q5

// q5s: GGUF Q5_0 blocks as the file stores them, what a model reads while its mapped file's Q5_0 blocks move
// into q5's layout (engine.model.settle): 22 bytes a block, fp16 d, 32 fifth bits (bit i: weight i), 16 nibble
// bytes (q4's order). Read by q5's kernels with m = -16 d, the minimum q5 stores for Q5_0 (exact), so its
// products have q5's bits.
namespace q5s {

constexpr int64_t kBytes = 22;

inline uint32_t fifth_bits(const uint8_t* block) {
  uint32_t h;
  std::memcpy(&h, block + 2, 4);
  return h;
}

inline float scale(const uint8_t* block) {
  uint16_t d;
  std::memcpy(&d, block, 2);
  return half_to_float(d);
}

// code i (0..31) of a block
inline int code(const uint8_t* block, int i) {
  const uint8_t b = block[6 + (i & 15)];
  return (i < 16 ? (b & 15) : (b >> 4)) | (int)((fifth_bits(block) >> i) & 1) << 4;
}

#ifdef PD_AVX2
// the 32 codes of a block, in weight order
inline __m256i codes(const uint8_t* block) { return _mm256_or_si256(q4::codes(block + 6), q5::spread(fifth_bits(block))); }
#endif

}  // namespace q5s
}  // namespace pagedeck
