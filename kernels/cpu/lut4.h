// The blocks-as-stored family: GGUF formats kept as the file stores their blocks, one exact fp32 scale per 32
// weights inside them, whose values are int8 codes (looked up in a 16-entry table for the 4-bit ones):
//   mxfp4 (GGUF MXFP4, gpt-oss's experts): 17 bytes a 32 weights: one E8M0 exponent byte e, 16 bytes of
//     nibbles; w = kvalues_mxfp4[code] * 2^(e - 128) (the E2M1 values doubled, so the exponent is one lower:
//     ggml's e8m0_to_fp32_half). The scale spans 2^-128..2^127, beyond fp16: it is kept as its byte.
//   iq4nl (GGUF IQ4_NL): 18 bytes a 32 weights: fp16 d, 16 bytes of nibbles; w = d * kvalues_iq4nl[code].
//   iq4xs (GGUF IQ4_XS): 136 bytes a 256 weights: fp16 d, 16 high and 32 low bits of eight 6-bit scales ls
//     (one a 32 weights), 128 bytes of nibbles (16 a 32); w = d (ls - 32) * kvalues_iq4nl[code].
//   q8s (GGUF Q8_0 as stored): 34 bytes a 32 weights: fp16 d, 32 int8 codes q; w = d q. No table: the codes
//     are the values. A model starts on it while its mapped file's Q8_0 blocks move into q8's layout
//     (engine.model.settle); being q8's product on the same codes and scales, it gives q8's bits.
// In every 4-bit block of 32 the low nibbles of its 16 bytes are weights 0..15, the high ones 16..31 (q4's
// order). Each block's scale is an exact fp32 value (a power of two; an fp16 value; an fp16 value times an
// integer below 33 in magnitude), so the blocks hold the file's weights exactly.
//
// The product of mxfp4, iq4nl and q8s is q8's (rows.h, qgemm.h); iq4xs's, with its sub-block scales applied as
// integers to activations quantized per 256, is iq4xs.h's (reading the codes through the helpers here). For the
// others a code becomes its value stored as u8 v + 128 (one vpshufb of the
// table, or q8s's code with its top bit flipped), then meets the int8 activations through q8::dot (dpbusd,
// taking 128 * sum(x) out once a block with VNNI; |v| * sign(x, v) on AVX2); every block's integer sum is
// exact, and the float part is q8's sequence: lane j % 8 of an accumulator takes fma(sum, d_w * d_x, acc) per
// block j, the result hsum(acc) + hsum(0). The GEMM path fills q8's panel (codes u8 v + 128, dw the fp32 block
// scales) and runs q8's tiles, which repeat that sequence, so prompt rows and decode rows give the same bits
// whatever the batch.
#pragma once

#include "activations.h"
#include "common.h"
#include "formats.h"
#include "panel.h"
#include "q8.h"

#include <algorithm>
#include <type_traits>

namespace pagedeck {
namespace lut4 {

// the 16 table values, each stored as u8 v + 128 (q8's form of an int8 code)
inline constexpr int8_t kMxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
inline constexpr int8_t kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

// 2^(e - 128) exactly (e = 0 and 1 are fp32 subnormals), ggml's e8m0_to_fp32_half
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A format of the family: its block bytes (kBytes a kValues weights), its table, and per block of 32 weights
// (j counts them along a row) the 16 nibble bytes (kNibbles; q8s: its 32 codes) and the exact fp32 scale.
struct Mxfp4 {
  static constexpr int64_t kValues = 32, kBytes = 17;
  static constexpr bool kNibbles = true;
  static constexpr const int8_t* kTable = kMxfp4;
  static const uint8_t* nibbles(const uint8_t* row, int64_t j) { return row + j * kBytes + 1; }
  static float scale(const uint8_t* row, int64_t j) { return e8m0_half(row[j * kBytes]); }
};

struct Iq4nl {
  static constexpr int64_t kValues = 32, kBytes = 18;
  static constexpr bool kNibbles = true;
  static constexpr const int8_t* kTable = kIq4nl;
  static const uint8_t* nibbles(const uint8_t* row, int64_t j) { return row + j * kBytes + 2; }
  static float scale(const uint8_t* row, int64_t j) { return half_at(row + j * kBytes); }
};

struct Iq4xs {  // its 6-bit sub-block scales meet the codes as integers: iq4xs.h
  static constexpr int64_t kValues = 256, kBytes = 136;
  static constexpr bool kNibbles = true;
  static constexpr const int8_t* kTable = kIq4nl;
  static const uint8_t* nibbles(const uint8_t* row, int64_t j) { return row + j / 8 * kBytes + 8 + 16 * (j % 8); }
};

// Q8_0's blocks as stored: no table, block j's 32 int8 codes after its fp16 scale
struct Q8s {
  static constexpr int64_t kValues = 32, kBytes = 34;
  static constexpr bool kNibbles = false;
  static constexpr const int8_t* kTable = nullptr;
  static const uint8_t* codes(const uint8_t* row, int64_t j) { return row + j * kBytes + 2; }
  static float scale(const uint8_t* row, int64_t j) { return half_at(row + j * kBytes); }
};

// The family's member of format id F (formats.h); void for the other formats
template <int F>
struct Of {
  using type = void;
};
template <>
struct Of<formats::kMXFP4> {
  using type = Mxfp4;
};
template <>
struct Of<formats::kIQ4NL> {
  using type = Iq4nl;
};
template <>
struct Of<formats::kIQ4XS> {
  using type = Iq4xs;
};
template <>
struct Of<formats::kQ8S> {
  using type = Q8s;
};
template <int F>
constexpr bool kIs = !std::is_void<typename Of<F>::type>::value;

// the int8 value of weight i (0..31) of block j of a row
template <class B>
inline int value(const uint8_t* row, int64_t j, int i) {
  if constexpr (!B::kNibbles) {
    return (int8_t)B::codes(row, j)[i];
  } else {
    const uint8_t b = B::nibbles(row, j)[i & 15];
    return B::kTable[i < 16 ? (b & 15) : (b >> 4)];
  }
}

#ifdef PD_AVX2
// the table as u8 v + 128 in both 128-bit lanes (vpshufb's lookup; unused by q8s)
template <class B>
inline __m256i table() {
  if constexpr (!B::kNibbles) {
    return _mm256_setzero_si256();
  } else {
    alignas(16) uint8_t t[16];
    for (int i = 0; i < 16; ++i) t[i] = (uint8_t)(B::kTable[i] + 128);
    return _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)t));
  }
}

// the 32 table values (u8 v + 128) of the 16 nibble bytes at p, in weight order
inline __m256i values(const uint8_t* p, __m256i tab) {
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m128i raw = _mm_loadu_si128((const __m128i*)p);
  const __m256i idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
  return _mm256_shuffle_epi8(tab, idx);
}

// the 32 values (u8 v + 128) of block j of a row, in weight order
template <class B>
inline __m256i block_values(const uint8_t* row, int64_t j, __m256i tab) {
  if constexpr (!B::kNibbles) {
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)B::codes(row, j)), _mm256_set1_epi8((char)0x80));
  } else {
    return values(B::nibbles(row, j), tab);
  }
}

// The fp32 scales of blocks j..j+7, as B::scale gives them one by one
template <class B>
inline __m256 scales8(const uint8_t* row, int64_t j) {
  alignas(32) float dw[8];
  for (int k = 0; k < 8; ++k) dw[k] = B::scale(row, j + k);
  return _mm256_load_ps(dw);
}

#ifdef PD_AVX512
// The 512-bit form of a group of 8 whole blocks, the one-row path's hot loop (the 256-bit one left a core at
// about half its share of DRAM bandwidth on gpt-oss's experts): two or four blocks' nibble bytes in one
// register, one table lookup for both nibbles of them, and the 8 blocks' dpbusd lanes reduced to one sum a block
// by a shuffle tree shared by the group. The same exact integer sums and the same float sequence as the
// 256-bit form, so the bits never depend on the instruction set.

// a byte index of a 512-bit permute, built once per format
struct Index64 {
  alignas(64) uint8_t b[64];
};

// The codes (u8 v + 128) of 4-bit blocks j..j+7 into c[0..4), two blocks a register (each 32 codes in weight
// order): four blocks' nibble bytes a register, each block's in one 128-bit lane, looked up in the table
template <class B>
inline void nibble_codes8(const uint8_t* row, int64_t j, __m512i tab, __m512i* c) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int q = 0; q < 2; ++q) {  // four blocks' nibble bytes a register, each block's in one 128-bit lane
    const int64_t jq = j + 4 * q;
    __m512i v;
    if constexpr (B::kValues == 256) {  // a super-block's nibble bytes lie together, 16 a block
      v = _mm512_loadu_si512((const void*)B::nibbles(row, jq));
    } else {
      v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)B::nibbles(row, jq)));
      for (int k = 1; k < 4; ++k) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i*)B::nibbles(row, jq + k)), k);
    }
    const __m512i lo = _mm512_shuffle_epi8(tab, _mm512_and_si512(v, low));
    const __m512i hi = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
    c[2 * q] = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi);
    c[2 * q + 1] = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), hi);
  }
}

// group8 (below) of a 4-bit format: its nibbles looked up in its table
template <class B>
inline __m256 nibble_group8(const uint8_t* row, int64_t j, __m512i tab, __m512i* c) {
#ifdef PD_AVX512_VBMI
  if constexpr (B::kValues == 32) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    // Two blocks' bytes in one masked load (nothing read past them); one byte permute puts each block's 16
    // nibble bytes twice side by side, a per-lane shift brings the high nibbles down in the second copy.
    // The scales come out of the same loads (a gather of them costs a third of the loop).
    static const Index64 nibbles = [] {
      Index64 t{};
      for (int p = 0; p < 64; ++p) t.b[p] = (uint8_t)(p / 32 * B::kBytes + (B::kBytes - 16) + p % 16);
      return t;
    }();
    // the scale bytes of the blocks of two loads (a: bytes 0..63, b: 64..127): 1 byte a block (MXFP4's
    // exponent) or 2 (IQ4_NL's fp16 d), blocks in order from byte 0
    static const Index64 scales = [] {
      Index64 t{};
      constexpr int kScaleBytes = B::kBytes - 16;
      for (int k = 0; k < 4; ++k)
        for (int i = 0; i < kScaleBytes; ++i) t.b[k * kScaleBytes + i] = (uint8_t)(k / 2 * 64 + k % 2 * B::kBytes + i);
      return t;
    }();
    const __m512i perm = _mm512_load_si512((const void*)nibbles.b);
    const __m512i high = _mm512_set1_epi64(0x0004000400040004);  // shift counts of the high copies' words
    const __m512i shift = _mm512_mask_blend_epi64(0xCC, _mm512_setzero_si512(), high);
    const __mmask64 bytes = (1ull << (2 * B::kBytes)) - 1;
    __m512i raw[4];
    for (int h = 0; h < 4; ++h) {
      raw[h] = _mm512_maskz_loadu_epi8(bytes, row + (j + 2 * h) * B::kBytes);
      const __m512i v = _mm512_srlv_epi16(_mm512_permutexvar_epi8(perm, raw[h]), shift);
      c[h] = _mm512_shuffle_epi8(tab, _mm512_and_si512(v, low));
    }
    const __m512i sidx = _mm512_load_si512((const void*)scales.b);
    const __m128i s03 = _mm512_castsi512_si128(_mm512_permutex2var_epi8(raw[0], sidx, raw[1]));
    const __m128i s47 = _mm512_castsi512_si128(_mm512_permutex2var_epi8(raw[2], sidx, raw[3]));
    if constexpr (std::is_same<B, Mxfp4>::value) {  // 2^(e - 128): e8m0_half, e = 0 and 1 its subnormals
      const __m256i e = _mm256_cvtepu8_epi32(_mm_unpacklo_epi32(s03, s47));
      const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
      const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
      return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
    } else {
      return _mm256_cvtph_ps(_mm_unpacklo_epi64(s03, s47));
    }
  }
#endif
  nibble_codes8<B>(row, j, tab, c);
  return scales8<B>(row, j);
}

// The codes (u8 v + 128) of blocks j..j+7 into c[0..4) (two blocks a register, each 32 codes in weight order)
// and their 8 fp32 scales: q8s's codes with their top bits flipped, the 4-bit formats' through nibble_group8.
template <class B>
inline __m256 group8(const uint8_t* row, int64_t j, __m512i tab, __m512i* c) {
  if constexpr (!B::kNibbles) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int h = 0; h < 4; ++h) {
      const __m256i a = _mm256_loadu_si256((const __m256i*)B::codes(row, j + 2 * h));
      const __m256i b = _mm256_loadu_si256((const __m256i*)B::codes(row, j + 2 * h + 1));
      c[h] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1), flip);
    }
    return scales8<B>(row, j);
  } else {
    return nibble_group8<B>(row, j, tab, c);
  }
}

// per 128-bit lane [a0 + a1, a2 + a3, b0 + b1, b2 + b3]: hadd's pattern on 512-bit registers
inline __m512i hadd512(__m512i a, __m512i b) {
  const __m512 fa = _mm512_castsi512_ps(a), fb = _mm512_castsi512_ps(b);
  return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(fa, fb, _MM_SHUFFLE(2, 0, 2, 0))),
                          _mm512_castps_si512(_mm512_shuffle_ps(fa, fb, _MM_SHUFFLE(3, 1, 3, 1))));
}

// lane k = the sum of block k's 8 dpbusd lanes, s[i] holding blocks 2i (low half) and 2i + 1 (high half)
inline __m256i block_sums8(const __m512i* s) {
  // hadd twice: 128-bit lane 0 [b0 b2 b4 b6 : lanes 0-3], 1 [the same : lanes 4-7], 2 and 3 the odd blocks'
  const __m512i h = hadd512(hadd512(s[0], s[1]), hadd512(s[2], s[3]));
  const __m512i r = _mm512_add_epi32(h, _mm512_shuffle_i64x2(h, h, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castsi512_si256(_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0), r));
}
#endif

// lane k = the sum of s[k]'s 8 int32 lanes (block k's): halves [blocks 0-3 | 0-3] and [4-7 | 4-7] added across lanes
inline __m256i block_sums8(const __m256i* s) {
  const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
  const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
}

// out[r] = weight row `row` (nb blocks of 32) . activation rows m0..m0+MT (quantize_rows without pairs; iq4xs's
// rows are iq4xs.h's)
template <class B, int MT>
inline void tile(const uint8_t* row, int64_t nb, const QuantAct& a, int64_t m0, float* out) {
  static_assert(!std::is_same<B, Iq4xs>::value, "iq4xs's rows are iq4xs.h's");
  const __m256i tab = table<B>(), zero = _mm256_setzero_si256();
  __m256 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t j0 = 0; j0 < nb; j0 += 8) {
    const int len = (int)std::min<int64_t>(8, nb - j0);
    {  // the row streams kPrefetch bytes ahead
      const char* q = (const char*)row + j0 * kBlock / B::kValues * B::kBytes + kPrefetch;
      for (int64_t b = 0; b < 8 * 32 * B::kBytes / B::kValues; b += 64) _mm_prefetch(q + b, _MM_HINT_T0);
    }
#ifdef PD_AVX512
    if (len == 8) {
      const __m512i tab512 = _mm512_broadcast_i32x4(_mm256_castsi256_si128(tab));
      __m512i c[4];
      const __m256 dwv = group8<B>(row, j0, tab512, c);
      for (int r = 0; r < MT; ++r) {
        const int8_t* x = a.q.data() + ((m0 + r) * nb + j0) * kBlock;
        __m512i s[4];
        for (int k = 0; k < 4; ++k)
          s[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[k], _mm512_loadu_si512((const void*)(x + 64 * k)));
        const int64_t at = (m0 + r) * a.nbp + j0;
        // u x - 128 x: the block sums of v x
        const __m256i sums = _mm256_sub_epi32(block_sums8(s), _mm256_slli_epi32(_mm256_loadu_si256((const __m256i*)(a.isum.data() + at)), 7));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(dwv, _mm256_loadu_ps(a.d.data() + at)), acc[r]);
      }
      continue;
    }
#endif
    __m256i c[8];
    for (int k = 0; k < len; ++k) c[k] = block_values<B>(row, j0 + k, tab);
    __m256 dwv;
    if (len == 8) {
      dwv = scales8<B>(row, j0);
    } else {
      alignas(32) float dw[8] = {};
      for (int k = 0; k < len; ++k) dw[k] = B::scale(row, j0 + k);
      dwv = _mm256_load_ps(dw);
    }
    for (int r = 0; r < MT; ++r) {
      const int8_t* x = a.q.data() + ((m0 + r) * nb + j0) * kBlock;
      __m256i s[8];
      for (int k = 0; k < 8; ++k) s[k] = k < len ? q8::dot(c[k], _mm256_loadu_si256((const __m256i*)(x + 32 * k))) : zero;
      __m256i sums = block_sums8(s);  // lane k: block j0 + k's exact sum
      const int64_t at = (m0 + r) * a.nbp + j0;
      if (kVnni)  // u x - 128 x: the block sums of v x (padding blocks: 0 - 0)
        sums = _mm256_sub_epi32(sums, _mm256_slli_epi32(_mm256_loadu_si256((const __m256i*)(a.isum.data() + at)), 7));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(dwv, _mm256_loadu_ps(a.d.data() + at)), acc[r]);
    }
  }
  for (int r = 0; r < MT; ++r) out[r] = hsum(acc[r]) + hsum(_mm256_setzero_ps());
}

// The codes of a GEMM panel of weight rows n0..n0+cols (panel.h's layout): the table values stored u8 v + 128
// ([block][4-byte step][column], 8 columns transposed at a time; columns past `cols` zero)
template <class B>
inline void unpack_codes(const uint8_t* qs, int64_t nb, int64_t n0, int cols, gemm::Panel& p) {
  using gemm::kCols;
  const int64_t row_bytes = nb * kBlock / B::kValues * B::kBytes;
  const __m256i tab = table<B>();
  p.codes.resize(nb * 8 * kCols);
  for (int g = 0; g < kCols; g += 8) {
    for (int64_t j = 0; j < nb; ++j) {
      __m256i r[8];
      for (int c = 0; c < 8; ++c)
        r[c] = g + c < cols ? block_values<B>(qs + (n0 + g + c) * row_bytes, j, tab) : _mm256_setzero_si256();
      gemm::transpose8(r);
      int32_t* dst = p.codes.data() + j * 8 * kCols + g;
      for (int t = 0; t < 8; ++t) _mm256_storeu_si256((__m256i*)(dst + t * kCols), r[t]);
    }
  }
}

// The GEMM path's panel of weight rows n0..n0+cols in q8's form: unpack_codes' codes, dw the blocks' fp32 scales;
// q8's tiles (qgemm.h) multiply it. (iq4xs has its own panel and tile: iq4xs.h.)
template <class B>
inline void unpack_panel(const uint8_t* qs, int64_t nb, int64_t n0, int cols, gemm::Panel& p) {
  static_assert(!std::is_same<B, Iq4xs>::value, "iq4xs's panel is iq4xs.h's");
  using gemm::kCols;
  const int64_t row_bytes = nb * kBlock / B::kValues * B::kBytes;
  unpack_codes<B>(qs, nb, n0, cols, p);
  p.dw.assign(nb * kCols, 0.0f);
  p.zw.assign(nb * kCols, 0.0f);
  p.slo.clear();
  p.shi.clear();
  for (int c = 0; c < cols; ++c) {
    const uint8_t* row = qs + (n0 + c) * row_bytes;
    int64_t j = 0;
    for (; j + 8 <= nb; j += 8) {
      alignas(32) float dw[8];
      _mm256_store_ps(dw, scales8<B>(row, j));
      for (int k = 0; k < 8; ++k) p.dw[(j + k) * kCols + c] = dw[k];
    }
    for (; j < nb; ++j) p.dw[j * kCols + c] = B::scale(row, j);
  }
}

#else  // portable: each block's exact integer sum, scaled block by block
template <class B, int MT>
inline void tile(const uint8_t* row, int64_t nb, const QuantAct& a, int64_t m0, float* out) {
  static_assert(!std::is_same<B, Iq4xs>::value, "iq4xs's rows are iq4xs.h's");
  for (int r = 0; r < MT; ++r) {
    float acc = 0.0f;
    for (int64_t j = 0; j < nb; ++j) {
      const int8_t* x = a.q.data() + ((m0 + r) * nb + j) * kBlock;
      int32_t s = 0;
      for (int i = 0; i < kBlock; ++i) s += value<B>(row, j, i) * x[i];
      acc += (float)s * (B::scale(row, j) * a.d[(m0 + r) * a.nbp + j]);
    }
    out[r] = acc;
  }
}
#endif

// out[m] = weight row n . activation row m (a: quantize_rows without pairs), 4 activation rows sharing each
// unpacked block: the decode path, and what the MoE dispatch calls per expert row
template <class B>
inline void weight_row(const uint8_t* qs, int64_t K, const QuantAct& a, int64_t M, int64_t n, float* out) {
  const int64_t nb = K / kBlock;
  const uint8_t* row = qs + n * (K / B::kValues) * B::kBytes;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile<B, 4>(row, nb, a, m, out + m);
  for (; m < M; ++m) tile<B, 1>(row, nb, a, m, out + m);
}

}  // namespace lut4
}  // namespace pagedeck
