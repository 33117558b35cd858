// q5: GGUF Q5_0 / Q5_1 weights, w = d * q + m with 5-bit codes q (0..31; Q5_0 is m = -16 d), d and m fp16 per
// block of 32 in q4's scale and minimum buffers. Held at 5 bits a weight instead of re-quantized to q8 (8.5):
// a Q5_0 matrix's decode step reads 0.65x the bytes.
//
// A row is its blocks in pairs, 40 bytes a pair: both blocks' 16 nibble bytes (q4's order: low nibbles are
// weights 0..15, high ones 16..31) and then 8 bytes of fifth bits, as 16-bit words [j: bits 0..15, j+1: bits
// 0..15, j: bits 16..31, j+1: bits 16..31]. One 32-byte load of the pair's nibbles (q4's pair load) then
// meets its fifth bits as one 64-bit word: the low half belongs to the low nibbles, the high half to the high
// ones. An odd last block is its 16 nibble bytes and its 32 bits in the file's order. 20 bytes a block, so
// block j of a row starts at j * kBytes either way (engine.model.repack writes the layout, q5_codes reads it).
//
// The products are q4's (qmatmul.cpp's dot_tile, qgemm.h's tiles) with the codes widened and centred at 16
// instead of 8: w = d (q - 16) + z, z = m + 16 d meets the exact block sum of x and the int8 sum meets -16 d,
// so the activation rounding meets d (q - 16) alone, as in llama.cpp's Q5_0 x Q8_0 dot product.
#pragma once

#include "common.h"

namespace pagedeck {
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
#if defined(__AVX512BW__) && defined(__AVX512VL__)
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
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m128i raw = _mm_loadu_si128((const __m128i*)nibbles(row, j));
  const __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
  return _mm256_or_si256(v, spread(fifth_bits(row, nb, j)));
}
#endif

}  // namespace q5
}  // namespace pagedeck
