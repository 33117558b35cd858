// Prompt-rows (GEMM) path of qmatmul: many activation rows against packed q4/q8 weights.
//
// The decode path (qmatmul.cpp's dot_tile) meets one weight row at a time and reduces every block's integer
// dot product horizontally; with many activation rows that is load- and shuffle-bound. Here a panel of kCols
// weight rows is unpacked once per call (8 columns at a time, through an 8x8 transpose of 4-byte words) into
// codes laid out [block][4-byte step][column] (cache blocking: the
// panel, kCols x K bytes, stays in L2 while every activation row passes over it), and a register tile of
// kRows activation rows x kCols columns accumulates with one broadcast 4-byte activation word against one
// vector of 8 columns per step (VNNI dpbusd, or AVX2 maddubs + madd): no horizontal reductions at all.
//
// Results are bit-identical to dot_tile's: the block sums are exact integers either way, and the float part
// repeats dot_tile's per-element sequence exactly: per block j, lane j % 8 of the element's accumulator
// takes fma(sum, d_w * d_x, acc) (q4: then fma(z_w, s_x, mins) and fnmadd(d_w, c_x, mins)), and the result
// is hsum(acc) + hsum(mins) with hsum's pairing ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), here done across 8
// columns at once. Lanes past a row's last block are left out where dot_tile adds exact zeros to them.
#pragma once

#include "common.h"

#ifdef PD_AVX2
#include <vector>

namespace pagedeck {
namespace gemm {

constexpr int kCols = 16;  // weight rows per panel: two vectors of 8 int32 lanes
constexpr int kRows = 4;   // activation rows per register tile

// One activation matrix, quantized as quantize_rows does without its q4 pair layout: q (M, K) int8 in natural
// order; per row and block (stride nbp): scale d, exact sum s, c = 8 d isum, integer sum isum.
struct Act {
  const int8_t* q;
  const float *d, *s, *c;
  const int32_t* isum;
  int64_t nb, nbp;
};

// A panel of up to kCols weight rows, unpacked: codes[(j * 8 + t) * kCols + col] holds weights 4t..4t+3 of
// block j (q4: codes 0..15; q8: stored u8 = q + 128), dw / zw[j * kCols + col] the block's fp32 scale and
// (q4) z = m + 8 d; columns past the panel's rows are zero.
struct Panel {
  std::vector<int32_t> codes;
  std::vector<float> dw, zw;
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

inline void unpack_panel(const uint8_t* qs, const uint16_t* d, const uint16_t* m, int64_t nb, bool q4, int64_t n0,
                         int cols, Panel& p) {
  p.codes.resize(nb * 8 * kCols);
  p.dw.assign(nb * kCols, 0.0f);
  p.zw.assign(nb * kCols, 0.0f);
  const __m128i low = _mm_set1_epi8(0x0F);
  for (int g = 0; g < kCols; g += 8) {  // 8 columns at a time: one block of each, transposed to [step][column]
    for (int64_t j = 0; j < nb; ++j) {
      __m256i r[8];
      for (int c = 0; c < 8; ++c) {
        const int64_t n = n0 + g + c;
        if (g + c >= cols) {
          r[c] = _mm256_setzero_si256();
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
    for (int64_t j = 0; j < nb; ++j) {
      const float dw = half_to_float(d[n * nb + j]);
      p.dw[j * kCols + c] = dw;
      if (q4) p.zw[j * kCols + c] = std::fma(8.0f, dw, half_to_float(m[n * nb + j]));
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
template <bool Q4>
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
template <int R, bool Q4>
inline void tile(const Panel& p, const Act& a, int64_t m0, float* out, int64_t ldo, int cols) {
  alignas(32) float acc[R][8][kCols] = {}, mins[R][8][kCols] = {};
  const int64_t nb = a.nb;
  const __m256i offset = _mm256_set1_epi8((char)0x80);
  for (int64_t j = 0; j < nb; ++j) {
    __m256i sums[R][2];
    for (int r = 0; r < R; ++r) sums[r][0] = sums[r][1] = _mm256_setzero_si256();
    const int32_t* wp = p.codes.data() + j * 8 * kCols;
    const int8_t* xq[R];
    for (int r = 0; r < R; ++r) xq[r] = a.q + ((m0 + r) * nb + j) * kBlock;
    for (int t = 0; t < 8; ++t) {
      __m256i w0 = _mm256_loadu_si256((const __m256i*)(wp + t * kCols));
      __m256i w1 = _mm256_loadu_si256((const __m256i*)(wp + t * kCols + 8));
      __m256i a0 = w0, a1 = w1;
      if (!Q4 && !kVnni) {  // q8 codes back to s8, and their magnitudes
        w0 = _mm256_xor_si256(w0, offset);
        w1 = _mm256_xor_si256(w1, offset);
        a0 = _mm256_sign_epi8(w0, w0);
        a1 = _mm256_sign_epi8(w1, w1);
      }
      for (int r = 0; r < R; ++r) {
        int32_t word;
        std::memcpy(&word, xq[r] + 4 * t, 4);
        const __m256i x = _mm256_set1_epi32(word);
        sums[r][0] = step<Q4>(sums[r][0], w0, a0, x);
        sums[r][1] = step<Q4>(sums[r][1], w1, a1, x);
      }
    }
    const int l = (int)(j & 7);
    const __m256 dw[2] = {_mm256_loadu_ps(p.dw.data() + j * kCols), _mm256_loadu_ps(p.dw.data() + j * kCols + 8)};
    for (int r = 0; r < R; ++r) {
      const int64_t at = (m0 + r) * a.nbp + j;
      const __m256 dx = _mm256_set1_ps(a.d[at]);
      const __m256i fix = _mm256_set1_epi32(!Q4 && kVnni ? 128 * a.isum[at] : 0);  // q8: the + 128 of the codes
      for (int h = 0; h < 2; ++h) {
        const __m256 s = _mm256_cvtepi32_ps(_mm256_sub_epi32(sums[r][h], fix));
        float* ap = acc[r][l] + 8 * h;
        _mm256_store_ps(ap, _mm256_fmadd_ps(s, _mm256_mul_ps(dw[h], dx), _mm256_load_ps(ap)));
        if (Q4) {
          const __m256 zw = _mm256_loadu_ps(p.zw.data() + j * kCols + 8 * h);
          float* mp = mins[r][l] + 8 * h;
          __m256 v = _mm256_fmadd_ps(zw, _mm256_set1_ps(a.s[at]), _mm256_load_ps(mp));
          _mm256_store_ps(mp, _mm256_fnmadd_ps(dw[h], _mm256_set1_ps(a.c[at]), v));
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

// out (M rows, stride ldo) = activation rows . weight rows n0..n0+cols of the panel p (already unpacked).
template <bool Q4>
inline void panel_rows(const Panel& p, const Act& a, int64_t M, float* out, int64_t ldo, int cols) {
  int64_t m = 0;
  for (; m + kRows <= M; m += kRows) tile<kRows, Q4>(p, a, m, out + m * ldo, ldo, cols);
  switch (M - m) {
    case 3: tile<3, Q4>(p, a, m, out + m * ldo, ldo, cols); break;
    case 2: tile<2, Q4>(p, a, m, out + m * ldo, ldo, cols); break;
    case 1: tile<1, Q4>(p, a, m, out + m * ldo, ldo, cols); break;
    default: break;
  }
}

}  // namespace gemm
}  // namespace pagedeck
#endif
