// The per-row (decode-sized) path of the per-32 formats q4, q5 (and q5s, Q5_0's blocks as stored) and q8
// (qmatmul.cpp's weight_row): one weight row unpacked a pair of blocks at a time and met by up to 4 activation
// rows (dot_tile), every block's integer dot product reduced exactly, then scaled. q4 and q5 are the affine
// nibble family (affine.h: w = d (q - c) + z, z = m + c d against the exact block sums of x), q8 the symmetric
// one (q8.h: codes stored u8 = q + 128). The K-quants' per-row kernels are q6.h's, q4k.h's and q4k16.h's.
#pragma once

#include "activations.h"
#include "affine.h"
#include "common.h"
#include "formats.h"
#include "q8.h"

#include <algorithm>

namespace pagedeck {
namespace rows {

using formats::kQ4;
using formats::kQ5;
using formats::kQ5S;
using formats::kQ8;

struct Weights {
  const uint8_t* qs;
  const uint16_t* d;  // q4, q5, q8 and q8g
  const uint16_t* m;  // q4 and q5 (q5s: inside its blocks, d with them)
  int64_t K, nb;
};

// the nibble formats: codes below 16 (q4) or 32 (q5, q5s), a minimum per block, products centred (qmatmul.cpp's
// top comment)
constexpr bool nibbled(int F) { return F == kQ4 || F == kQ5 || F == kQ5S; }
constexpr bool five_bit(int F) { return F == kQ5 || F == kQ5S; }
constexpr float centre(int F) { return q5::centre(five_bit(F)); }

#ifdef PD_AVX2
// Scales are read 8 fp16 values at a time (isa.h's load_halfs); lanes past the row's end read the next row's
// (finite) scales or the tensor's padding (kScalePad), and meet zero sums and zero activation scales there.

// Two consecutive blocks (j, j+1) of one weight row, unpacked once and met by every activation row of a tile.
// q4: one 32-byte load of both blocks' nibbles; the low nibbles meet x[0:16] of both blocks, the high ones
// x[16:32] (quantize_rows' pair layout); an odd last block of a row is unpacked alone.
// q8: codes stored as u8 = q + 128 (dpbusd multiplies u8 by s8); the +128 is taken out through c.
struct Pair {
  __m256i a, b;
  int blocks;  // 2, 1 (odd last block), 0 (past the row's end)
};

template <int F>
inline Pair load_pair(const Weights& w, int64_t n, int64_t j, int64_t left) {
  const __m256i low = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
  if (left <= 0) return {zero, zero, 0};
  if (F == kQ5S) {  // the file's blocks: their nibbles and fifth bits put as q5's pair has them
    const uint8_t* b = w.qs + (n * w.nb + j) * q5s::kBytes;
    if (left >= 2) {
      const uint8_t* b1 = b + q5s::kBytes;
      const __m256i v = _mm256_set_m128i(_mm_loadu_si128((const __m128i*)(b1 + 6)), _mm_loadu_si128((const __m128i*)(b + 6)));
      const uint32_t h0 = q5s::fifth_bits(b), h1 = q5s::fifth_bits(b1);
      return {_mm256_or_si256(_mm256_and_si256(v, low), q5::spread((h0 & 0xFFFF) | h1 << 16)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), q5::spread(h0 >> 16 | (h1 & 0xFFFF0000u))), 2};
    }
    return {q5s::codes(b), zero, 1};
  }
  if (F == kQ5) {  // affine.h's q5 pair: 32 nibble bytes, then the fifth bits of the low and the high nibbles
    const uint8_t* p = w.qs + (n * w.nb + j) * q5::kBytes;
    if (left >= 2) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)p);
      uint64_t h;
      std::memcpy(&h, p + 32, 8);
      return {_mm256_or_si256(_mm256_and_si256(v, low), q5::spread((uint32_t)h)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), q5::spread((uint32_t)(h >> 32))), 2};
    }
    return {q5::codes(w.qs + n * w.nb * q5::kBytes, w.nb, j), zero, 1};
  }
  if (F == kQ4) {
    if (left >= 2) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)(w.qs + (n * w.nb + j) * 16));
      return {_mm256_and_si256(v, low), _mm256_and_si256(_mm256_srli_epi16(v, 4), low), 2};
    }
    return {q4::codes(w.qs + (n * w.nb + j) * 16), zero, 1};
  }
  const __m256i* p = (const __m256i*)(w.qs + (n * w.nb + j) * 32);
  return {_mm256_loadu_si256(p), left >= 2 ? _mm256_loadu_si256(p + 1) : zero, left >= 2 ? 2 : 1};
}

// int32 partial sums of the pair against activation blocks at x: lanes 0-3 block j, lanes 4-7 block j+1
template <int F>
inline __m256i dot_pair(const Pair& w, const int8_t* x) {
  constexpr bool Q4 = nibbled(F);
  const __m256i zero = _mm256_setzero_si256();
  if (w.blocks == 0) return zero;
  const __m256i x0 = _mm256_loadu_si256((const __m256i*)x);
  const __m256i x1 = w.blocks == 2 ? _mm256_loadu_si256((const __m256i*)(x + kBlock)) : zero;
  if (Q4 && w.blocks == 2) return _mm256_add_epi32(dot_u8s8(zero, w.a, x0), dot_u8s8(zero, w.b, x1));
  if (Q4) {
    const __m256i p = dot_u8s8(zero, w.a, x0);
    return _mm256_zextsi128_si256(_mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
  }
  // hadd: [p0 01, p0 23, p1 01, p1 23 | p0 45, p0 67, p1 45, p1 67] -> lanes 0-3 block j, 4-7 block j+1
  return _mm256_permute4x64_epi64(_mm256_hadd_epi32(q8::dot(w.a, x0), q8::dot(w.b, x1)), 0xd8);
}

// out[r * ldo + c] = row n0 + c of W . activation row m0 + r, for r < MT, c < NT.
// Blocks go in groups of 8: each block's int32 dot product is reduced exactly (hadd tree) to one lane of a
// vector, then one fma per group scales the 8 blocks by d_w * d_x. Every (r, c) pair has its own chain
// of the same operations in the same order, so the tile shape (MT, NT) never changes a result.
template <int MT, int NT, int F>
inline void dot_tile(const Weights& w, int64_t n0, const QuantAct& a, int64_t m0, float* out, int64_t ldo) {
  constexpr bool Q4 = nibbled(F);
  __m256 acc[MT][NT], mins[MT][NT];
  for (int r = 0; r < MT; ++r)
    for (int c = 0; c < NT; ++c) acc[r][c] = mins[r][c] = _mm256_setzero_ps();
  const int64_t nb = w.nb;
  const int64_t bpb = F == kQ5S ? q5s::kBytes : F == kQ5 ? q5::kBytes : Q4 ? 16 : 32;  // code bytes a block
  for (int64_t j0 = 0; j0 < nb; j0 += 8) {
    const int64_t len = std::min<int64_t>(8, nb - j0);
    {  // each weight row of the tile streams kPrefetch bytes of codes ahead (on into the next rows)
      for (int c = 0; c < NT; ++c) {
        const char* q = (const char*)(w.qs + ((n0 + c) * nb + j0) * bpb) + kPrefetch;
        for (int64_t b = 0; b < 8 * bpb; b += 64) _mm_prefetch(q + b, _MM_HINT_T0);
      }
      const int64_t ahead = kPrefetch / bpb;
      if (F != kQ5S) _mm_prefetch((const char*)(w.d + n0 * nb + j0 + ahead), _MM_HINT_T0);
      if (Q4 && F != kQ5S) _mm_prefetch((const char*)(w.m + n0 * nb + j0 + ahead), _MM_HINT_T0);
    }
    __m256i half[MT][NT], sums[MT][NT];
    for (int k = 0; k < 4; ++k) {
      const int64_t j = j0 + 2 * k;
      Pair p[NT];
      for (int c = 0; c < NT; ++c) p[c] = load_pair<F>(w, n0 + c, j, len - 2 * k);
      for (int r = 0; r < MT; ++r) {
        const int8_t* x = a.q.data() + ((m0 + r) * nb + j) * kBlock;
        for (int c = 0; c < NT; ++c) {
          const __m256i q = dot_pair<F>(p[c], x);
          if (k % 2 == 0) {
            sums[r][c] = q;
          } else if (k == 1) {
            half[r][c] = _mm256_hadd_epi32(sums[r][c], q);
          } else {  // [b0 b2 b4 b6 | b1 b3 b5 b7]
            sums[r][c] = _mm256_hadd_epi32(half[r][c], _mm256_hadd_epi32(sums[r][c], q));
          }
        }
      }
    }
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int c = 0; c < NT; ++c) {
      __m256 dw, m;
      if constexpr (F == kQ5S) {  // the blocks' d (lanes past the row's end 0: they meet zero sums), m = -16 d
        alignas(32) float t[8] = {};
        for (int64_t k = 0; k < len; ++k) t[k] = q5s::scale(w.qs + ((n0 + c) * nb + j0 + k) * q5s::kBytes);
        dw = _mm256_load_ps(t);
        m = _mm256_mul_ps(dw, _mm256_set1_ps(-16.0f));
      } else {
        dw = load_halfs(w.d + (n0 + c) * nb + j0);
        m = Q4 ? load_halfs(w.m + (n0 + c) * nb + j0) : dw;
      }
      const __m256 zw = Q4 ? _mm256_fmadd_ps(_mm256_set1_ps(centre(F)), dw, m) : dw;
      for (int r = 0; r < MT; ++r) {
        const int64_t at = (m0 + r) * a.nbp + j0;
        __m256i exact = _mm256_permutevar8x32_epi32(sums[r][c], order);
        if (!Q4 && kVnni)  // u x - 128 x: the block sums of q x (padding blocks: 0 - 0)
          exact = _mm256_sub_epi32(exact, _mm256_slli_epi32(_mm256_loadu_si256((const __m256i*)(a.isum.data() + at)), 7));
        const __m256 blocks = _mm256_cvtepi32_ps(exact);
        acc[r][c] = _mm256_fmadd_ps(blocks, _mm256_mul_ps(dw, _mm256_loadu_ps(a.d.data() + at)), acc[r][c]);
        if (Q4) {  // w = d (q - 8) + z: the block offset z meets the exact sum of x, the -8 d the int8 sum
          __m256 c8 = _mm256_loadu_ps(a.c.data() + at);  // 8 d_x isum; q5's 16 d_x isum is exactly twice it
          if (five_bit(F)) c8 = _mm256_add_ps(c8, c8);
          mins[r][c] = _mm256_fmadd_ps(zw, _mm256_loadu_ps(a.s.data() + at), mins[r][c]);
          mins[r][c] = _mm256_fnmadd_ps(dw, c8, mins[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < MT; ++r)
    for (int c = 0; c < NT; ++c) out[r * ldo + c] = hsum(acc[r][c]) + hsum(mins[r][c]);
}

#else  // portable: each block's exact integer dot product, scaled block by block
template <int MT, int NT, int F>
inline void dot_tile(const Weights& w, int64_t n0, const QuantAct& a, int64_t m0, float* out, int64_t ldo) {
  constexpr bool Q4 = nibbled(F);
  for (int r = 0; r < MT; ++r) {
    for (int c = 0; c < NT; ++c) {
      const int64_t n = n0 + c;
      float acc = 0.0f, mins = 0.0f;
      for (int64_t j = 0; j < w.nb; ++j) {
        const int64_t blk = (m0 + r) * a.nbp + j;
        const int8_t* xq = a.q.data() + ((m0 + r) * w.nb + j) * kBlock;
        int32_t s = 0;
        for (int i = 0; i < kBlock; ++i) {
          int wq;
          if (F == kQ5S) {
            wq = q5s::code(w.qs + (n * w.nb + j) * q5s::kBytes, i);
          } else if (F == kQ5) {
            wq = q5::code(w.qs + n * w.nb * q5::kBytes, w.nb, j, i);
          } else if (Q4) {
            const uint8_t b = w.qs[(n * w.nb + j) * 16 + (i & 15)];
            wq = i < 16 ? (b & 15) : (b >> 4);
          } else {
            wq = (int)w.qs[(n * w.nb + j) * 32 + i] - 128;  // u8 = q + 128
          }
          s += wq * xq[i];
        }
        const float dw = F == kQ5S ? q5s::scale(w.qs + (n * w.nb + j) * q5s::kBytes) : half_to_float(w.d[n * w.nb + j]);
        acc += (float)s * (dw * a.d[blk]);
        if (Q4) {
          const float m = F == kQ5S ? -16.0f * dw : half_to_float(w.m[n * w.nb + j]);
          mins += (m + centre(F) * dw) * a.s[blk] - dw * a.c[blk] * (centre(F) / 8);
        }
      }
      out[r * ldo + c] = acc + mins;
    }
  }
}

#endif

}  // namespace rows
}  // namespace pagedeck
