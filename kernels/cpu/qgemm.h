// Prompt-rows (GEMM) path of qmatmul: many activation rows against packed q4/q6/q8 weights.
//
// The decode path (qmatmul.cpp's dot_tile) meets one weight row at a time and reduces every block's integer
// dot product horizontally; with many activation rows that is load- and shuffle-bound. Here a panel of kCols
// weight rows is unpacked once per call (8 columns at a time, through an 8x8 transpose of 4-byte words) into
// codes laid out [block][4-byte step][column] (cache blocking: the
// panel, kCols x K bytes, stays in L2 while every activation row passes over it), and a register tile of
// kRows activation rows x kCols columns accumulates with one broadcast 4-byte activation word against one
// vector of 8 columns per step (VNNI dpbusd, or AVX2 maddubs + madd): no horizontal reductions at all.
// With AVX-512 VNNI, q4 and q5 take tile512 (one zmm of all 16 columns a step), q8 tile512_seq (the same with
// its accumulators in registers), and q4, q5 and q8 panels unpack with 512-bit permutes (unpack_*_block,
// unpack_scales16); q6 keeps the 256-bit tile. Another format feeds the
// same tiles by filling a Panel (codes, dw, zw; q6: slo, shi) as unpack_panel documents; q4k fills a Panel
// with its own meaning of the fields and runs its own tile (q4k.h: integer sub-block scales).
//
// Results are bit-identical to dot_tile's: the block sums are exact integers either way, and the float part
// repeats dot_tile's per-element sequence exactly: per block j, lane j % 8 of the element's accumulator
// takes fma(sum, d_w * d_x, acc) (q4: then fma(z_w, s_x, mins) and fnmadd(d_w, c_x, mins)), and the result
// is hsum(acc) + hsum(mins) with hsum's pairing ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), here done across 8
// columns at once. Lanes past a row's last block are left out where dot_tile adds exact zeros to them.
#pragma once

#include "common.h"
#include "formats.h"
#include "q5.h"
#include "q6.h"

#ifdef PD_AVX2
#include <vector>

namespace pagedeck {
namespace gemm {

constexpr int kCols = 16;  // weight rows per panel: two vectors of 8 int32 lanes
constexpr int kRows = 4;   // activation rows per register tile
using formats::kQ4;  // the formats' ids (formats.h, generated from kernels/formats.py)
using formats::kQ5;
using formats::kQ6;
using formats::kQ8;
constexpr int64_t kChunk512 = 64;  // blocks a pass of tile512 takes, 8 for each lane's registers

// One activation matrix, quantized as quantize_rows does without its q4 pair layout: q (M, K) int8 in natural
// order; per row and block (stride nbp): scale d, exact sum s, c = 8 d isum (q5 doubles it), integer sum isum;
// q6: xs16, the integer sums per 16 (stride 2 nbp).
struct Act {
  const int8_t* q;
  const float *d, *s, *c;
  const int32_t* isum;
  int64_t nb, nbp;
  const int16_t* xs16;
};

// A panel of up to kCols weight rows, unpacked: codes[(j * 8 + t) * kCols + col] holds weights 4t..4t+3 of
// block j (q4: codes 0..15; q5: 0..31; q8: stored u8 = q + 128), dw / zw[j * kCols + col] the block's fp32 scale
// and (q4) z = m + 8 d (q5: m + 16 d); columns past the panel's rows are zero. q6: codes 0..63, dw the
// super-block's d, slo / shi the int8 scales of the block's two halves of 16.
// What the tiles read of a panel: an unpacked Panel's vectors, or weights kept in that layout (q8's row groups).
struct View {
  const int32_t* codes;
  const float *dw, *zw;
  const int32_t *slo, *shi;
};

struct Panel {
  std::vector<int32_t> codes;
  std::vector<float> dw, zw;
  std::vector<int32_t> slo, shi;
  View view() const { return {codes.data(), dw.data(), zw.data(), slo.data(), shi.data()}; }
};

// r[c] = the 8 code words (t = 0..7) of one block of column c; afterwards r[t] = word t of columns 0..7
inline void transpose8(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
  }
}

// q6 panel: one pass over each super-block of a column (its 192 code bytes read once, as q6::tile reads them,
// instead of 64 bytes per block and a variable shift), the 8 blocks of 8 columns transposed together; d
// converted once per super-block instead of once per block. The same codes and scales as q6_codes.
inline void unpack_q6_panel(const uint8_t* qs, int64_t nb, int64_t n0, int cols, Panel& p) {
  const int64_t nsb = nb / 8, q6row = nsb * q6::kBytes;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
  for (int g = 0; g < kCols; g += 8) {
    for (int64_t s = 0; s < nsb; ++s) {
      __m256i blk[8][8];  // [block of the super-block][column]
      for (int c = 0; c < 8; ++c) {
        if (g + c >= cols) {
          for (int b = 0; b < 8; ++b) blk[b][c] = _mm256_setzero_si256();
          continue;
        }
        const uint8_t* sb = qs + (n0 + g + c) * q6row + s * q6::kBytes;
        for (int n = 0; n < 2; ++n) {
          const __m256i q0 = _mm256_loadu_si256((const __m256i*)(sb + 64 * n));
          const __m256i q1 = _mm256_loadu_si256((const __m256i*)(sb + 64 * n + 32));
          const __m256i h = _mm256_loadu_si256((const __m256i*)(sb + 128 + 32 * n));
          blk[4 * n][c] = _mm256_or_si256(_mm256_and_si256(q0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
          blk[4 * n + 1][c] = _mm256_or_si256(_mm256_and_si256(q1, m4),
                                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4));
          blk[4 * n + 2][c] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q0, 4), m4),
                                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4));
          blk[4 * n + 3][c] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q1, 4), m4),
                                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4));
        }
      }
      for (int b = 0; b < 8; ++b) {
        transpose8(blk[b]);
        int32_t* dst = p.codes.data() + (s * 8 + b) * 8 * kCols + g;
        for (int t = 0; t < 8; ++t) _mm256_storeu_si256((__m256i*)(dst + t * kCols), blk[b][t]);
      }
    }
  }
  int c0 = 0;  // full groups of 8 columns: the scales' bytes gathered one dword (sc[2b], sc[2b + 1], ...) a column
  for (; c0 + 8 <= cols; c0 += 8) {
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)q6row));
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* base = qs + (n0 + c0) * q6row + s * q6::kBytes;
      // bytes 206..209: sc[14], sc[15] and d (never read past the super-block)
      const __m256i top = _mm256_i32gather_epi32((const int*)(base + 206), idx, 1);
      const __m256i dh = _mm256_srli_epi32(top, 16);
      const __m256 d = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(dh), _mm256_extracti128_si256(dh, 1)));
      for (int b = 0; b < 8; ++b) {
        const __m256i x = b == 7 ? top : _mm256_i32gather_epi32((const int*)(base + 192 + 2 * b), idx, 1);
        const int64_t at = (s * 8 + b) * kCols + c0;
        _mm256_storeu_ps(p.dw.data() + at, d);
        _mm256_storeu_si256((__m256i*)(p.slo.data() + at), _mm256_srai_epi32(_mm256_slli_epi32(x, 24), 24));
        _mm256_storeu_si256((__m256i*)(p.shi.data() + at), _mm256_srai_epi32(_mm256_slli_epi32(x, 16), 24));
      }
    }
  }
  for (int c = c0; c < cols; ++c) {
    const uint8_t* row = qs + (n0 + c) * q6row;
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* sb = row + s * q6::kBytes;
      const float d = q6::scale_d(sb);
      const int8_t* sc = (const int8_t*)(sb + 192);
      for (int b = 0; b < 8; ++b) {
        const int64_t at = (s * 8 + b) * kCols + c;
        p.dw[at] = d;
        p.slo[at] = sc[2 * b];
        p.shi[at] = sc[2 * b + 1];
      }
    }
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define PD_GEMM512 1
// T[L] = [X[0] lane L, X[1] lane L, X[2] lane L, X[3] lane L] (128-bit lanes): a 4x4 transpose of lanes
inline void transpose_lanes(const __m512i X[4], __m512i T[4]) {
  const __m512i u0 = _mm512_shuffle_i64x2(X[0], X[1], 0x44), u1 = _mm512_shuffle_i64x2(X[2], X[3], 0x44);
  const __m512i v0 = _mm512_shuffle_i64x2(X[0], X[1], 0xEE), v1 = _mm512_shuffle_i64x2(X[2], X[3], 0xEE);
  T[0] = _mm512_shuffle_i64x2(u0, u1, 0x88);
  T[1] = _mm512_shuffle_i64x2(u0, u1, 0xDD);
  T[2] = _mm512_shuffle_i64x2(v0, v1, 0x88);
  T[3] = _mm512_shuffle_i64x2(v0, v1, 0xDD);
}

// T[t] = dword t of the 16 bytes at b + c * st, for the 16 columns c (lane c of each vector): four columns a
// vector (one per 128-bit lane), a dword transpose in each, then a transpose across lanes.
inline void words16(const uint8_t* b, int64_t st, __m512i T[4]) {
  const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  __m512i X[4];
  for (int g = 0; g < 4; ++g) {
    const uint8_t* p = b + 4 * g * st;
    __m512i A = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)p));
    A = _mm512_inserti32x4(A, _mm_loadu_si128((const __m128i*)(p + st)), 1);
    A = _mm512_inserti32x4(A, _mm_loadu_si128((const __m128i*)(p + 2 * st)), 2);
    A = _mm512_inserti32x4(A, _mm_loadu_si128((const __m128i*)(p + 3 * st)), 3);
    X[g] = _mm512_permutexvar_epi32(tr, A);
  }
  transpose_lanes(X, T);
}

// q4 codes of block j of 16 full columns: word t < 4 of a column = the low nibbles of its raw dword t, word
// t + 4 the high ones.
inline void unpack_q4_block(const uint8_t* qs, int64_t nb, int64_t n0, int64_t j, int32_t* dst) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512i T[4];
  words16(qs + (n0 * nb + j) * 16, nb * 16, T);
  for (int t = 0; t < 4; ++t) {
    _mm512_storeu_si512((void*)(dst + t * kCols), _mm512_and_si512(T[t], low));
    _mm512_storeu_si512((void*)(dst + (t + 4) * kCols), _mm512_and_si512(_mm512_srli_epi16(T[t], 4), low));
  }
}

// q8 codes of block j of 16 full columns: word t of a column is its stored dword t (u8 = q + 128), each half
// of 16 bytes through words16. One zmm permute and a lane transpose for what took transpose8's 24 ymm shuffles
// per 8 columns. A q8 panel's unpack is most of an 8-row call on a 262k x 640 head (~15 of ~20 ms): this made
// such calls 1.15x faster (20.8 -> 18.1 ms at 8 rows, alternated in one process; kernels/PERF.md).
inline void unpack_q8_block(const uint8_t* qs, int64_t nb, int64_t n0, int64_t j, int32_t* dst) {
  for (int h = 0; h < 2; ++h) {
    __m512i T[4];
    words16(qs + (n0 * nb + j) * 32 + 16 * h, nb * 32, T);
    for (int t = 0; t < 4; ++t) _mm512_storeu_si512((void*)(dst + (t + 4 * h) * kCols), T[t]);
  }
}

// q5 codes of block j of 16 full columns: q4's nibble words (words16 on the nibble bytes) plus 16 where a
// weight's fifth bit is set. Each column's 32 fifth bits are gathered into its lane (two dword gathers inside
// the pair's 8 bytes of bits), byte k of every lane is repeated over the lane's 4 bytes, and per code word w
// (weights 4w..4w+3: half of byte w / 2) one vptestmb gives the byte mask that one masked vpaddb adds 16 under.
// The same codes as q5::codes, transposed (kernels/PERF.md: the q5 share of an 8-row decode step).
inline void unpack_q5_block(const uint8_t* qs, int64_t nb, int64_t n0, int64_t j, int32_t* dst) {
  const int64_t st = nb * q5::kBytes;
  const uint8_t* row0 = qs + n0 * st;
  const __m512i low = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
  __m512i T[4], c[8];
  words16(q5::nibbles(row0, j), st, T);
  for (int t = 0; t < 4; ++t) {
    c[t] = _mm512_and_si512(T[t], low);
    c[t + 4] = _mm512_and_si512(_mm512_srli_epi16(T[t], 4), low);
  }
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32((int)st));
  __m512i h;
  if ((j & 1) == 0 && j + 1 == nb) {  // an odd last block: the file's word
    h = _mm512_i32gather_epi32(idx, (const void*)(row0 + j * q5::kBytes + 16), 1);
  } else {  // the pair's words [j lo, j+1 lo] and [j hi, j+1 hi] (q5.h)
    const uint8_t* hb = row0 + (j & ~int64_t(1)) * q5::kBytes + 32;
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
  for (int w = 0; w < 8; ++w) _mm512_storeu_si512((void*)(dst + w * kCols), c[w]);
}

// dw[(j + i) * kCols + c] = d of column c, block j + i, for 16 full columns and blocks j..j+15 (zw: fma(8, dw, m)
// as the scalar loop): 16 loads of 16 fp16 scales, a 16x16 transpose
inline void unpack_scales16(const uint16_t* d, const uint16_t* m, float centre, int64_t nb, int64_t n0, int64_t j,
                            float* dw, float* zw) {
  auto transposed = [&](const uint16_t* src, __m512 out[16]) {
    __m512 r[16];
    for (int c = 0; c < 16; ++c) r[c] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(src + (n0 + c) * nb + j)));
    __m512i B[4][4];  // B[q][e] lane L: rows 4q..4q+3 of column 4L + e
    for (int q = 0; q < 4; ++q) {
      const __m512 a0 = _mm512_unpacklo_ps(r[4 * q], r[4 * q + 1]), a1 = _mm512_unpackhi_ps(r[4 * q], r[4 * q + 1]);
      const __m512 a2 = _mm512_unpacklo_ps(r[4 * q + 2], r[4 * q + 3]),
                   a3 = _mm512_unpackhi_ps(r[4 * q + 2], r[4 * q + 3]);
      B[q][0] = _mm512_castpd_si512(_mm512_unpacklo_pd(_mm512_castps_pd(a0), _mm512_castps_pd(a2)));
      B[q][1] = _mm512_castpd_si512(_mm512_unpackhi_pd(_mm512_castps_pd(a0), _mm512_castps_pd(a2)));
      B[q][2] = _mm512_castpd_si512(_mm512_unpacklo_pd(_mm512_castps_pd(a1), _mm512_castps_pd(a3)));
      B[q][3] = _mm512_castpd_si512(_mm512_unpackhi_pd(_mm512_castps_pd(a1), _mm512_castps_pd(a3)));
    }
    for (int e = 0; e < 4; ++e) {
      const __m512i X[4] = {B[0][e], B[1][e], B[2][e], B[3][e]};
      __m512i T[4];
      transpose_lanes(X, T);
      for (int L = 0; L < 4; ++L) out[4 * L + e] = _mm512_castsi512_ps(T[L]);
    }
  };
  __m512 vd[16];
  transposed(d, vd);
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dw + (j + i) * kCols, vd[i]);
  if (!m) return;
  __m512 vm[16];
  transposed(m, vm);
  const __m512 c = _mm512_set1_ps(centre);
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(zw + (j + i) * kCols, _mm512_fmadd_ps(c, vd[i], vm[i]));
}
#endif

inline void unpack_panel(const uint8_t* qs, const uint16_t* d, const uint16_t* m, int64_t nb, int fmt, int64_t n0,
                         int cols, Panel& p) {
  const bool q4 = fmt == kQ4, q5f = fmt == kQ5, q6f = fmt == kQ6;
  const float centre = q5::centre(q5f);
  p.codes.resize(nb * 8 * kCols);
  p.dw.assign(nb * kCols, 0.0f);
  p.zw.assign(nb * kCols, 0.0f);
  p.slo.assign(q6f ? nb * kCols : 0, 0);
  p.shi.assign(q6f ? nb * kCols : 0, 0);
  if (q6f) return unpack_q6_panel(qs, nb, n0, cols, p);
  const __m128i low = _mm_set1_epi8(0x0F);
#ifdef PD_GEMM512
  const bool fast = cols == kCols, q8f = fmt == kQ8;
  if (fast && q4)
    for (int64_t j = 0; j < nb; ++j) unpack_q4_block(qs, nb, n0, j, p.codes.data() + j * 8 * kCols);
  if (fast && q8f)
    for (int64_t j = 0; j < nb; ++j) unpack_q8_block(qs, nb, n0, j, p.codes.data() + j * 8 * kCols);
  if (fast && q5f)
    for (int64_t j = 0; j < nb; ++j) unpack_q5_block(qs, nb, n0, j, p.codes.data() + j * 8 * kCols);
  int64_t scaled = 0;  // blocks whose scales are unpacked
  if (fast)
    for (; scaled + 16 <= nb; scaled += 16)
      unpack_scales16(d, q4 || q5f ? m : nullptr, centre, nb, n0, scaled, p.dw.data(), p.zw.data());
  for (int g = 0; g < kCols && !(fast && (q4 || q8f || q5f)); g += 8) {
#else
  const int64_t scaled = 0;
  for (int g = 0; g < kCols; g += 8) {
#endif  // 8 columns at a time: one block of each, transposed to [step][column]
    for (int64_t j = 0; j < nb; ++j) {
      __m256i r[8];
      for (int c = 0; c < 8; ++c) {
        const int64_t n = n0 + g + c;
        if (g + c >= cols) {
          r[c] = _mm256_setzero_si256();
        } else if (q5f) {
          r[c] = q5::codes(qs + n * nb * q5::kBytes, nb, j);
        } else if (q4) {
          const __m128i raw = _mm_loadu_si128((const __m128i*)(qs + (n * nb + j) * 16));
          r[c] = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
        } else {
          r[c] = _mm256_loadu_si256((const __m256i*)(qs + (n * nb + j) * 32));
        }
      }
      transpose8(r);
      int32_t* dst = p.codes.data() + j * 8 * kCols + g;
      for (int t = 0; t < 8; ++t) _mm256_storeu_si256((__m256i*)(dst + t * kCols), r[t]);
    }
  }
  for (int c = 0; c < cols; ++c) {
    const int64_t n = n0 + c;
    for (int64_t j = scaled; j < nb; ++j) {
      const float dw = half_to_float(d[n * nb + j]);
      p.dw[j * kCols + c] = dw;
      if (q4 || q5f) p.zw[j * kCols + c] = std::fma(centre, dw, half_to_float(m[n * nb + j]));
    }
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

// acc += 4-byte dot products of weight codes w (u8; q8 AVX2: the s8 codes wq with |wq| = aw) and the broadcast
// activation word x (s8).
template <bool Q4>  // Q4: codes below 128 (q4 and q6)
inline __m256i step(__m256i acc, __m256i w, __m256i aw, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  (void)aw;
  return _mm256_dpbusd_epi32(acc, w, x);
#else
  const __m256i ones = _mm256_set1_epi16(1);
  if (Q4) return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));
  // q8: maddubs saturates for u8 codes up to 255, so |q| x sign(x, q) as dot_q8 does (at most 128 * 127 * 2)
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), ones));
#endif
}

// out[r * ldo + c] for activation rows m0..m0+R and the panel's first `cols` columns.
// q6: the steps of each half of 16 sum apart, S = slo (sum_lo - 32 xs_lo) + shi (sum_hi - 32 xs_hi): the per-row
// path's exact integer.
template <int R, int F>
inline void tile(const View& p, const Act& a, int64_t m0, float* out, int64_t ldo, int cols) {
  constexpr bool Q4 = F == kQ4 || F == kQ5, U8 = F != kQ8;
  alignas(32) float acc[R][8][kCols] = {}, mins[R][8][kCols] = {};
  const int64_t nb = a.nb;
  const __m256i offset = _mm256_set1_epi8((char)0x80);
  for (int64_t j = 0; j < nb; ++j) {
    __m256i sums[R][2], lo[R][2];
    for (int r = 0; r < R; ++r) sums[r][0] = sums[r][1] = lo[r][0] = lo[r][1] = _mm256_setzero_si256();
    const int32_t* wp = p.codes + j * 8 * kCols;
    const int8_t* xq[R];
    for (int r = 0; r < R; ++r) xq[r] = a.q + ((m0 + r) * nb + j) * kBlock;
    for (int t = 0; t < 8; ++t) {
      if (F == kQ6 && t == 4) {
        for (int r = 0; r < R; ++r)
          for (int h = 0; h < 2; ++h) {
            lo[r][h] = sums[r][h];
            sums[r][h] = _mm256_setzero_si256();
          }
      }
      __m256i w0 = _mm256_loadu_si256((const __m256i*)(wp + t * kCols));
      __m256i w1 = _mm256_loadu_si256((const __m256i*)(wp + t * kCols + 8));
      __m256i a0 = w0, a1 = w1;
      if (!U8 && !kVnni) {  // q8 codes back to s8, and their magnitudes
        w0 = _mm256_xor_si256(w0, offset);
        w1 = _mm256_xor_si256(w1, offset);
        a0 = _mm256_sign_epi8(w0, w0);
        a1 = _mm256_sign_epi8(w1, w1);
      }
      for (int r = 0; r < R; ++r) {
        int32_t word;
        std::memcpy(&word, xq[r] + 4 * t, 4);
        const __m256i x = _mm256_set1_epi32(word);
        sums[r][0] = step<U8>(sums[r][0], w0, a0, x);
        sums[r][1] = step<U8>(sums[r][1], w1, a1, x);
      }
    }
    const int l = (int)(j & 7);
    const __m256 dw[2] = {_mm256_loadu_ps(p.dw + j * kCols), _mm256_loadu_ps(p.dw + j * kCols + 8)};
    for (int r = 0; r < R; ++r) {
      const int64_t at = (m0 + r) * a.nbp + j;
      const __m256 dx = _mm256_set1_ps(a.d[at]);
      const __m256i fix = _mm256_set1_epi32(F == kQ8 && kVnni ? 128 * a.isum[at] : 0);  // q8: the + 128 of the codes
      for (int h = 0; h < 2; ++h) {
        __m256i isums = _mm256_sub_epi32(sums[r][h], fix);
        if (F == kQ6) {
          const __m256i slo = _mm256_loadu_si256((const __m256i*)(p.slo + j * kCols + 8 * h));
          const __m256i shi = _mm256_loadu_si256((const __m256i*)(p.shi + j * kCols + 8 * h));
          const __m256i xlo = _mm256_set1_epi32(32 * a.xs16[2 * at]), xhi = _mm256_set1_epi32(32 * a.xs16[2 * at + 1]);
          isums = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_sub_epi32(lo[r][h], xlo), slo),
                                   _mm256_mullo_epi32(_mm256_sub_epi32(sums[r][h], xhi), shi));
        }
        const __m256 s = _mm256_cvtepi32_ps(isums);
        float* ap = acc[r][l] + 8 * h;
        _mm256_store_ps(ap, _mm256_fmadd_ps(s, _mm256_mul_ps(dw[h], dx), _mm256_load_ps(ap)));
        if (Q4) {
          const __m256 zw = _mm256_loadu_ps(p.zw + j * kCols + 8 * h);
          float* mp = mins[r][l] + 8 * h;
          __m256 v = _mm256_fmadd_ps(zw, _mm256_set1_ps(a.s[at]), _mm256_load_ps(mp));
          _mm256_store_ps(mp, _mm256_fnmadd_ps(dw[h], _mm256_set1_ps(F == kQ5 ? a.c[at] + a.c[at] : a.c[at]), v));
        }
      }
    }
  }
  auto hsum8 = [](float (*v)[kCols], int h) {  // hsum's pairing, column-wise
    auto L = [&](int l) { return _mm256_load_ps(v[l] + 8 * h); };
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(L(0), L(4)), _mm256_add_ps(L(2), L(6))),
                         _mm256_add_ps(_mm256_add_ps(L(1), L(5)), _mm256_add_ps(L(3), L(7))));
  };
  for (int r = 0; r < R; ++r) {
    alignas(32) float res[kCols];
    for (int h = 0; h < 2; ++h) _mm256_store_ps(res + 8 * h, _mm256_add_ps(hsum8(acc[r], h), hsum8(mins[r], h)));
    std::memcpy(out + r * ldo, res, cols * sizeof(float));
  }
}

#ifdef PD_GEMM512
// The same tile with 512-bit vectors: one zmm holds the panel's 16 columns, so a step is one weight load and,
// per activation row, one dpbusd with the activation word broadcast from memory ({1to16}). Every lane does
// the ymm tile's operations in its order (the same bits). Zen 4 retires one zmm dpbusd a cycle against two
// ymm ones, but half the loads, broadcasts and epilogue instructions per multiply-add (kernels/PERF.md).
// sums[r] += the 4-byte products of step t of block j (codes at wp) with activation row r: one weight load,
// one dpbusd a row with the activation word broadcast
template <int R>
inline void step512(const int32_t* wp, const int8_t* const* xrow, int64_t j, int t, __m512i* sums) {
  const __m512i w = _mm512_loadu_si512((const void*)(wp + t * kCols));
  for (int r = 0; r < R; ++r) {
    int32_t word;
    std::memcpy(&word, xrow[r] + j * kBlock + 4 * t, 4);
    sums[r] = _mm512_dpbusd_epi32(sums[r], w, _mm512_set1_epi32(word));
  }
}

// q8's 512-bit tile: up to 3 activation rows with every lane's accumulator in a register (8 R zmm; q8 has no
// minimums to accumulate), so the blocks are read in address order, one after another, where tile512's
// lane-major order (its accumulators would not fit) walks each panel 8 times at a stride: with that walk a
// one-row call on a q8g head was slower than the row-ordered per-row path. Each lane sees tile512's sequence
// (the same bits).
template <int R>
inline void tile512_seq(const View& p, const Act& a, int64_t m0, float* out, int64_t ldo, int cols) {
  __m512 va[R][8];
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < 8; ++l) va[r][l] = _mm512_setzero_ps();
  const int64_t nb = a.nb;
  const int8_t* xrow[R];
  for (int r = 0; r < R; ++r) xrow[r] = a.q + (m0 + r) * nb * kBlock;
  for (int64_t j = 0; j < nb; ++j) {
    __m512i sums[R];
    for (int r = 0; r < R; ++r) sums[r] = _mm512_setzero_si512();
    const int32_t* wp = p.codes + j * 8 * kCols;
    for (int t = 0; t < 8; ++t) step512<R>(wp, xrow, j, t, sums);
    const __m512 dw = _mm512_loadu_ps(p.dw + j * kCols);
    const int l = (int)(j & 7);
    for (int r = 0; r < R; ++r) {
      const int64_t at = (m0 + r) * a.nbp + j;
      const __m512i isums = _mm512_sub_epi32(sums[r], _mm512_set1_epi32(128 * a.isum[at]));
      va[r][l] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isums), _mm512_mul_ps(dw, _mm512_set1_ps(a.d[at])), va[r][l]);
    }
  }
  const __mmask16 keep = (__mmask16)((1u << cols) - 1);
  for (int r = 0; r < R; ++r) {  // hsum's pairing; the mins are zeros (q8 has none), added as tile512 does
    const __m512* v = va[r];
    const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v[0], v[4]), _mm512_add_ps(v[2], v[6])),
                                   _mm512_add_ps(_mm512_add_ps(v[1], v[5]), _mm512_add_ps(v[3], v[7])));
    _mm512_mask_storeu_ps(out + r * ldo, keep, _mm512_add_ps(s, _mm512_setzero_ps()));
  }
}

template <int R, int F>
inline void tile512(const View& p, const Act& a, int64_t m0, float* out, int64_t ldo, int cols) {
  static_assert(F != kQ8, "q8 takes tile512_seq");
  constexpr bool Q4 = F == kQ4 || F == kQ5;
  // lane l of an element's accumulators takes blocks l, l + 8, l + 16, ... in order, so the lanes run one
  // after another with their accumulators in registers (the per-row path's order within each lane)
  alignas(64) float acc[R][8][kCols] = {}, mins[R][8][kCols] = {};
  const int64_t nb = a.nb;
  const int8_t* xrow[R];
  for (int r = 0; r < R; ++r) xrow[r] = a.q + (m0 + r) * nb * kBlock;
  for (int64_t j0 = 0; j0 < nb; j0 += kChunk512)
  for (int l = 0; l < 8; ++l) {
    __m512 va[R], vm[R];
    for (int r = 0; r < R; ++r) {
      va[r] = _mm512_load_ps(acc[r][l]);
      vm[r] = _mm512_load_ps(mins[r][l]);
    }
    const int64_t j1 = std::min<int64_t>(nb, j0 + kChunk512);
    for (int64_t j = j0 + l; j < j1; j += 8) {
      __m512i sums[R], lo[R];
      for (int r = 0; r < R; ++r) sums[r] = lo[r] = _mm512_setzero_si512();
      const int32_t* wp = p.codes + j * 8 * kCols;
      for (int t = 0; t < 8; ++t) {
        if (F == kQ6 && t == 4) {
          for (int r = 0; r < R; ++r) {
            lo[r] = sums[r];
            sums[r] = _mm512_setzero_si512();
          }
        }
        step512<R>(wp, xrow, j, t, sums);
      }
      const __m512 dw = _mm512_loadu_ps(p.dw + j * kCols);
      const __m512 zw = Q4 ? _mm512_loadu_ps(p.zw + j * kCols) : dw;
      for (int r = 0; r < R; ++r) {
        const int64_t at = (m0 + r) * a.nbp + j;
        __m512i isums = sums[r];
        if (F == kQ6) {
          const __m512i slo = _mm512_loadu_si512((const void*)(p.slo + j * kCols));
          const __m512i shi = _mm512_loadu_si512((const void*)(p.shi + j * kCols));
          const __m512i xlo = _mm512_set1_epi32(32 * a.xs16[2 * at]), xhi = _mm512_set1_epi32(32 * a.xs16[2 * at + 1]);
          isums = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_sub_epi32(lo[r], xlo), slo),
                                   _mm512_mullo_epi32(_mm512_sub_epi32(sums[r], xhi), shi));
        }
        va[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isums), _mm512_mul_ps(dw, _mm512_set1_ps(a.d[at])), va[r]);
        if (Q4) {
          const float c = F == kQ5 ? a.c[at] + a.c[at] : a.c[at];
          vm[r] = _mm512_fnmadd_ps(dw, _mm512_set1_ps(c), _mm512_fmadd_ps(zw, _mm512_set1_ps(a.s[at]), vm[r]));
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      _mm512_store_ps(acc[r][l], va[r]);
      _mm512_store_ps(mins[r][l], vm[r]);
    }
  }
  auto hsum8 = [](float (*v)[kCols]) {  // hsum's pairing, column-wise
    auto L = [&](int l) { return _mm512_load_ps(v[l]); };
    return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(L(0), L(4)), _mm512_add_ps(L(2), L(6))),
                         _mm512_add_ps(_mm512_add_ps(L(1), L(5)), _mm512_add_ps(L(3), L(7))));
  };
  const __mmask16 keep = (__mmask16)((1u << cols) - 1);
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(out + r * ldo, keep, _mm512_add_ps(hsum8(acc[r]), hsum8(mins[r])));
}
constexpr int kRows512 = 4;  // activation rows per 512-bit register tile
#endif

// out (M rows, stride ldo) = activation rows . weight rows n0..n0+cols of the panel p (already unpacked).
// q6 keeps the 256-bit tile: its zmm form (two vpmulld a block and row) ran 0.7x as fast at 512 rows. q8 takes
// tile512_seq (panel_rows), never tile512.
template <int F>
constexpr bool kWide = F != kQ6 && F != kQ8;

template <int F, int R = 1>
inline void rows_tail(const View& p, const Act& a, int64_t m, int64_t left, float* out, int64_t ldo, int cols) {
#ifdef PD_GEMM512
  if constexpr (kWide<F>) {
    if (left == R) return tile512<R, F>(p, a, m, out, ldo, cols);
    if constexpr (R + 1 < kRows512) rows_tail<F, R + 1>(p, a, m, left, out, ldo, cols);
    return;
  }
#endif
  if (left == R) return tile<R, F>(p, a, m, out, ldo, cols);
  if constexpr (R + 1 < kRows) rows_tail<F, R + 1>(p, a, m, left, out, ldo, cols);
}

template <int F>
inline void panel_rows(const View& p, const Act& a, int64_t M, float* out, int64_t ldo, int cols) {
  int64_t m = 0;
#ifdef PD_GEMM512
  if constexpr (F == kQ8) {  // three rows a tile, in address order (tile512_seq)
    for (; m + 3 <= M; m += 3) tile512_seq<3>(p, a, m, out + m * ldo, ldo, cols);
    if (M - m == 2) tile512_seq<2>(p, a, m, out + m * ldo, ldo, cols);
    if (M - m == 1) tile512_seq<1>(p, a, m, out + m * ldo, ldo, cols);
    return;
  }
  if constexpr (kWide<F>)
    for (; m + kRows512 <= M; m += kRows512) tile512<kRows512, F>(p, a, m, out + m * ldo, ldo, cols);
#endif
  for (; m + kRows <= M; m += kRows) tile<kRows, F>(p, a, m, out + m * ldo, ldo, cols);
  if (M > m) rows_tail<F>(p, a, m, M - m, out + m * ldo, ldo, cols);
}

}  // namespace gemm
}  // namespace pagedeck
#endif
