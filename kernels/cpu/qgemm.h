// Prompt-rows (GEMM) path of qmatmul: many activation rows against packed q4/q5/q8 weights (and the formats whose
// panels are q8's); the integer-scale tiles of the K-quants and IQ4_XS live with their formats (q4k.h, q6.h,
// iq4xs.h).
//
// The decode path (qmatmul.cpp's dot_tile) meets one weight row at a time and reduces every block's integer
// dot product horizontally; with many activation rows that is load- and shuffle-bound. Here a panel of kCols
// weight rows is unpacked once per call (8 columns at a time, through an 8x8 transpose of 4-byte words) into
// codes laid out [block][4-byte step][column] (cache blocking: the
// panel, kCols x K bytes, stays in L2 while every activation row passes over it), and a register tile of
// kRows activation rows x kCols columns accumulates with one broadcast 4-byte activation word against one
// vector of 8 columns per step (VNNI dpbusd, or AVX2 maddubs + madd): no horizontal reductions at all.
// With AVX-512 VNNI, q4 and q5 take tile512 (one zmm of all 16 columns a step), q8 tile512 too for calls of
// 16 rows or more (8 rows a tile) and tile512_seq below that (the same with its accumulators in registers), and
// q4, q5 and q8 panels unpack with 512-bit permutes (affine.h's and q8.h's
// unpack_block16, panel.h's unpack_scales16). The panel layout is panel.h's; each format's own unpacker lives
// with the format (affine.h, q8.h) and unpack_panel here picks it. Another format feeds the same tiles by
// filling a Panel (codes, dw, zw) as panel.h documents; q4k, q6 and iq4xs fill a Panel with their own meaning of
// the fields and run their own tiles (q4k.h, q6.h, iq4xs.h: integer sub-block scales).
//
// Results are bit-identical to dot_tile's: the block sums are exact integers either way, and the float part
// repeats dot_tile's per-element sequence exactly: per block j, lane j % 8 of the element's accumulator
// takes fma(sum, d_w * d_x, acc) (q4: then fma(z_w, s_x, mins) and fnmadd(d_w, c_x, mins)), and the result
// is hsum(acc) + hsum(mins) with hsum's pairing ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), here done across 8
// columns at once. Lanes past a row's last block are left out where dot_tile adds exact zeros to them.
#pragma once

#include "affine.h"
#include "common.h"
#include "formats.h"
#include "panel.h"
#include "q8.h"

#ifdef PD_AVX2
#include <algorithm>

namespace pagedeck {
namespace gemm {

using formats::kQ4;  // the formats' ids (formats.h, generated from kernels/formats.py)
using formats::kQ5;
using formats::kQ5S;
using formats::kQ8;
// Not a stored format: panels of codes u8 = q + offset (View::offset; q4g's groups without minimums, GGUF
// Q4_0's w = d (q - 8)), multiplied as q8's are: each block's sum starts from -offset times the activations'
// sum, so it is the exact sum of (q - offset) x and no minimums accumulate.
constexpr int kCentred = -1;
constexpr int64_t kChunk512 = 64;  // blocks a pass of tile512 takes, 8 for each lane's registers

// The panel of weight rows n0..n0+cols of format fmt (panel.h's layout), by the format's own unpacker
inline void unpack_panel(const uint8_t* qs, const uint16_t* d, const uint16_t* m, int64_t nb, int fmt, int64_t n0,
                         int cols, Panel& p) {
  const bool q4 = fmt == kQ4, q5f = fmt == kQ5, q5s = fmt == kQ5S;  // q5s: its scales in its blocks
  const float centre = q5::centre(q5f || q5s);
  p.codes.resize(nb * 8 * kCols);
  p.dw.assign(nb * kCols, 0.0f);
  p.zw.assign(nb * kCols, 0.0f);
#ifdef PD_AVX512
  const bool fast = cols == kCols && !q5s, q8f = fmt == kQ8;
  if (fast && q4)
    for (int64_t j = 0; j < nb; ++j) q4::unpack_block16(qs, nb, n0, j, p.codes.data() + j * 8 * kCols);
  if (fast && q8f)
    for (int64_t j = 0; j < nb; ++j) q8::unpack_block16(qs, nb, n0, j, p.codes.data() + j * 8 * kCols);
  if (fast && q5f)
    for (int64_t j = 0; j < nb; ++j) q5::unpack_block16(qs, nb, n0, j, p.codes.data() + j * 8 * kCols);
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
        } else if (q5s) {
          r[c] = q5s::codes(qs + (n * nb + j) * q5s::kBytes);
        } else if (q5f) {
          r[c] = q5::codes(qs + n * nb * q5::kBytes, nb, j);
        } else if (q4) {
          r[c] = q4::codes(qs + (n * nb + j) * 16);
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
      if (q5s) {  // m = -16 d, the minimum q5 stores for Q5_0
        const float dw = q5s::scale(qs + (n * nb + j) * q5s::kBytes);
        p.dw[j * kCols + c] = dw;
        p.zw[j * kCols + c] = std::fma(centre, dw, -16.0f * dw);
        continue;
      }
      const float dw = half_to_float(d[n * nb + j]);
      p.dw[j * kCols + c] = dw;
      if (q4 || q5f) p.zw[j * kCols + c] = std::fma(centre, dw, half_to_float(m[n * nb + j]));
    }
  }
}

// acc += 4-byte dot products of weight codes w (u8; q8 without VNNI: the s8 codes w with |w| = aw) and the
// broadcast activation word x (s8): isa.h's dot_u8s8, or dot_s8 for q8's codes on AVX2.
template <bool U8>  // U8: codes below 128 (q4 and q5), or VNNI's u8 q8 codes
inline __m256i step(__m256i acc, __m256i w, __m256i aw, __m256i x) {
  if (U8 || kVnni) return dot_u8s8(acc, w, x);
  return dot_s8(acc, w, aw, x);
}

// out[r * ldo + c] for activation rows m0..m0+R and the panel's first `cols` columns.
template <int R, int F>
inline void tile(const View& p, const Act& a, int64_t m0, float* out, int64_t ldo, int cols) {
  constexpr bool Q4 = F == kQ4 || F == kQ5, U8 = F != kQ8;
  alignas(32) float acc[R][8][kCols] = {}, mins[R][8][kCols] = {};
  const int64_t nb = a.nb;
  const __m256i offset = _mm256_set1_epi8((char)0x80);
  for (int64_t j = 0; j < nb; ++j) {
    __m256i sums[R][2];
    for (int r = 0; r < R; ++r) sums[r][0] = sums[r][1] = _mm256_setzero_si256();
    const int32_t* wp = p.codes + j * 8 * kCols;
    const int8_t* xq[R];
    for (int r = 0; r < R; ++r) xq[r] = a.q + ((m0 + r) * nb + j) * kBlock;
    for (int t = 0; t < 8; ++t) {
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
      // q8: the + 128 of the codes (its AVX2 form multiplies q itself); centred codes: their offset
      const __m256i fix = _mm256_set1_epi32((F == kQ8 && kVnni) || F == kCentred ? p.offset * a.isum[at] : 0);
      for (int h = 0; h < 2; ++h) {
        const __m256 s = _mm256_cvtepi32_ps(_mm256_sub_epi32(sums[r][h], fix));
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

#ifdef PD_AVX512
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
// lane-major order walks each panel 8 times at a stride: with that walk a one-row call on a q8g head was slower
// than the row-ordered per-row path (prompt chunks take tile512's walk: panel_rows). Each lane sees tile512's
// sequence (the same bits).
template <int R>
inline void tile512_seq(const View& p, const Act& a, int64_t m0, float* out, int64_t ldo, int cols) {
  __m512 va[R][8];
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < 8; ++l) va[r][l] = _mm512_setzero_ps();
  const int64_t nb = a.nb;
  const int8_t* xrow[R];
  for (int r = 0; r < R; ++r) xrow[r] = a.q + (m0 + r) * nb * kBlock;
  for (int64_t j = 0; j < nb; ++j) {
    __m512i sums[R];  // from -offset times the activations' sum: the + offset of the codes taken off as they add up
    for (int r = 0; r < R; ++r) sums[r] = _mm512_set1_epi32(-p.offset * a.isum[(m0 + r) * a.nbp + j]);
    const int32_t* wp = p.codes + j * 8 * kCols;
    for (int t = 0; t < 8; ++t) step512<R>(wp, xrow, j, t, sums);
    const __m512 dw = _mm512_loadu_ps(p.dw + j * kCols);
    const int l = (int)(j & 7);
    for (int r = 0; r < R; ++r) {
      const int64_t at = (m0 + r) * a.nbp + j;
      va[r][l] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]), _mm512_mul_ps(dw, _mm512_set1_ps(a.d[at])), va[r][l]);
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
  constexpr bool Q4 = F == kQ4 || F == kQ5;
  // lane l of an element's accumulators takes blocks l, l + 8, l + 16, ... in order, so the lanes run one
  // after another with their accumulators in registers (the per-row path's order within each lane)
  alignas(64) float acc[R][8][kCols] = {}, mins[R][8][kCols] = {};
  const int64_t nb = a.nb;
  const int8_t* xrow[R];
  for (int r = 0; r < R; ++r) xrow[r] = a.q + (m0 + r) * nb * kBlock;
  for (int64_t j0 = 0; j0 < nb; j0 += kChunk512)
  for (int l = 0; l < 8; ++l) {
    __m512 va[R], vm[R];  // vm: Q4's minimums only (the other formats' stay zeros, never loaded)
    for (int r = 0; r < R; ++r) {
      va[r] = _mm512_load_ps(acc[r][l]);
      vm[r] = Q4 ? _mm512_load_ps(mins[r][l]) : _mm512_setzero_ps();
    }
    const int64_t j1 = std::min<int64_t>(nb, j0 + kChunk512);
    for (int64_t j = j0 + l; j < j1; j += 8) {
      // q8 starts from -128 times the block's activations' sum (its codes are u8 q + 128), centred codes from
      // -offset times it
      __m512i sums[R];
      for (int r = 0; r < R; ++r)
        sums[r] = F == kQ8 || F == kCentred ? _mm512_set1_epi32(-p.offset * a.isum[(m0 + r) * a.nbp + j])
                                            : _mm512_setzero_si512();
      const int32_t* wp = p.codes + j * 8 * kCols;
      for (int t = 0; t < 8; ++t) step512<R>(wp, xrow, j, t, sums);
      const __m512 dw = _mm512_loadu_ps(p.dw + j * kCols);
      const __m512 zw = Q4 ? _mm512_loadu_ps(p.zw + j * kCols) : dw;
      for (int r = 0; r < R; ++r) {
        const int64_t at = (m0 + r) * a.nbp + j;
        const __m512 s = _mm512_cvtepi32_ps(sums[r]);
        va[r] = _mm512_fmadd_ps(s, _mm512_mul_ps(dw, _mm512_set1_ps(a.d[at])), va[r]);
        if (Q4) {
          const float c = F == kQ5 ? a.c[at] + a.c[at] : a.c[at];
          vm[r] = _mm512_fnmadd_ps(dw, _mm512_set1_ps(c), _mm512_fmadd_ps(zw, _mm512_set1_ps(a.s[at]), vm[r]));
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      _mm512_store_ps(acc[r][l], va[r]);
      if (Q4) _mm512_store_ps(mins[r][l], vm[r]);
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
// q8's lane-major tile: 8 rows (16 zmm of accumulators and block sums: q8 keeps no minimums), for calls of at
// least kLaneMajorQ8 rows (prompt chunks); fewer rows (8 chats' steps over a q8g head) keep tile512_seq's
// address order
constexpr int kRowsQ8 = 8;
constexpr int64_t kLaneMajorQ8 = 16;
#endif

// out (M rows, stride ldo) = activation rows . weight rows n0..n0+cols of the panel p (already unpacked).
// q8 (and the lookup-table formats, whose
// panels are q8's) takes tile512 with 8 rows a tile for prompt chunks (lane-major, 16 zmm live: 1.1x tile512_seq's
// 3 rows on IQ4_XS matrices at 512 rows) and tile512_seq for the rows left and for small calls.
template <int F>
constexpr bool kWide = F != kQ8 && F != kCentred;

template <int F, int R = 1>
inline void rows_tail(const View& p, const Act& a, int64_t m, int64_t left, float* out, int64_t ldo, int cols) {
#ifdef PD_AVX512
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
#ifdef PD_AVX512
  if constexpr (F == kQ8 || F == kCentred) {  // eight rows a lane-major tile for prompt chunks, then three a tile
    if (M >= kLaneMajorQ8)
      for (; m + kRowsQ8 <= M; m += kRowsQ8) tile512<kRowsQ8, F>(p, a, m, out + m * ldo, ldo, cols);
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

