// q4g: q4 rows (GGUF Q4_0 / Q4_1: 16 nibble bytes a block of 32 weights, fp16 d and m beside them) regrouped 16
// at a time, so that one 512-bit vector holds the same 4 bytes of 16 weight rows and a decode-sized product
// needs no horizontal reduction. rows.h's per-row tile reduces every block's int32 lanes with hadd chains and
// each row ends in two horizontal sums: on the default model's 576-wide rows one core read 16-25 GB/s from
// cache (23-36 with its rows paired) where the grouped K-quants read 42-66.
//
// A group of 16 rows (r = 0..15) of K weights (nb = K / 32 blocks):
//   qs (N / 16, nb * 256) uint8: block j's nibbles at [256 j, 256 j + 256): word t (t = 0..3: the row's bytes
//       4t..4t+3, whose low nibbles are weights 4t..4t+3 and high ones 16+4t..16+4t+3) of row r at
//       256 j + 64 t + 4 r;
//   d, m (N / 16, nb * 16) fp16: block j's scale and minimum of row r at 16 j + r.
// Rows become groups in place (group_in_place; kernels/packed.py's q4_group, and q4_ungroup the other way).
//
// The arithmetic is rows.h's dot_tile's, lane for lane: per row and block j the exact int32 sum I of its codes
// (0..15) times the activation's int8 codes, then in lane j % 8 of the row's two accumulators acc = fma(I, d_w
// d_x, acc), mins = fma(z_w, s_x, mins) and mins = fnmadd(d_w, c_x, mins), z_w = fma(8, d_w, m_w) (qmatmul.cpp's
// top comment: the centred product); the result is hsum(acc) + hsum(mins) in isa.h's hsum pairing. So a group
// gives q4 rows' bits (the per-row and the GEMM path alike) whatever the batch, the row order or the threads.
#pragma once

#include "activations.h"
#include "common.h"
#include "panel.h"

#include <cmath>
#include <cstring>

namespace pagedeck {
namespace q4g {

constexpr int kRows = 16;
constexpr int64_t kBlockBytes = kRows * 16;  // one block of a group: 256 nibble bytes
// Blocks the group kernel prefetches ahead (4 KB of codes): the default model's decode step (2,000 steps of
// Model.forward, alternating) 3.51-3.78 ms two blocks ahead, 3.27-3.29 eight, 2.96-3.07 sixteen, 3.09-3.13
// thirty-two, 3.16-3.19 in rows.
constexpr int64_t kAhead = 16;

// Group g's 16 rows regrouped where they lie: rows and groups hold the same 16 x nb x 16 code bytes and 16 x nb
// scales and minimums (rows' stride nb), only their order differs. tmp: 16 x nb x 16 bytes, tmp_s 2 x 16 x nb fp16.
inline void group_in_place(uint8_t* codes, uint16_t* scale, uint16_t* minimum, int64_t nb, uint8_t* tmp,
                           uint16_t* tmp_s) {
  std::memcpy(tmp, codes, kRows * nb * 16);
  std::memcpy(tmp_s, scale, kRows * nb * sizeof(uint16_t));
  std::memcpy(tmp_s + kRows * nb, minimum, kRows * nb * sizeof(uint16_t));
  for (int r = 0; r < kRows; ++r)
    for (int64_t j = 0; j < nb; ++j) {
      for (int t = 0; t < 4; ++t) std::memcpy(codes + j * kBlockBytes + 64 * t + 4 * r, tmp + (r * nb + j) * 16 + 4 * t, 4);
      scale[j * kRows + r] = tmp_s[r * nb + j];
      minimum[j * kRows + r] = tmp_s[kRows * nb + r * nb + j];
    }
}

// hsum's pairing of one row's eight lane accumulators: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))
inline float pair_sum(const float* l) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }

// out[m * 16 + r] = weight row 16 g + r . activation row m, m < M: the statement above, one lane at a time (the
// builds without AVX-512, whose loader keeps q4 in rows; tests compare it with the vector kernel).
inline void group_rows_portable(const uint8_t* qs, const uint16_t* d, const uint16_t* mn, int64_t nb,
                                const QuantAct& a, int64_t M, int64_t g, float* out) {
  const uint8_t* grp = qs + g * nb * kBlockBytes;
  const uint16_t *gd = d + g * nb * kRows, *gm = mn + g * nb * kRows;
  for (int64_t m = 0; m < M; ++m)
    for (int r = 0; r < kRows; ++r) {
      float acc[8] = {}, mins[8] = {};
      for (int64_t j = 0; j < nb; ++j) {
        const int8_t* x = a.q.data() + (m * nb + j) * kBlock;
        int32_t I = 0;
        for (int t = 0; t < 4; ++t)
          for (int i = 0; i < 4; ++i) {
            const uint8_t b = grp[j * kBlockBytes + 64 * t + 4 * r + i];
            I += (b & 15) * x[4 * t + i] + (b >> 4) * x[16 + 4 * t + i];
          }
        const int64_t at = m * a.nbp + j;
        const float dw = half_to_float(gd[j * kRows + r]), zw = std::fma(8.0f, dw, half_to_float(gm[j * kRows + r]));
        const int l = (int)(j % 8);
        const float ddx = dw * a.d[at];
        acc[l] = std::fma((float)I, ddx, acc[l]);
        mins[l] = std::fma(zw, a.s[at], mins[l]);
        mins[l] = std::fma(-dw, a.c[at], mins[l]);
      }
      out[m * kRows + r] = pair_sum(acc) + pair_sum(mins);
    }
}

#ifdef PD_AVX512
// One activation row x (its K int8 codes; scales, sums and c at a.*[at0 + j]) against group grp: out[r], r < 16.
// Lane l of acc / mins is the accumulator of blocks j = l (mod 8), kept in registers by unrolling 8 blocks.
inline void group_row(const uint8_t* grp, const uint16_t* gd, const uint16_t* gm, int64_t nb, const int8_t* x,
                      const QuantAct& a, int64_t at0, bool prefetch, float* out) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512 eight = _mm512_set1_ps(8.0f);
  __m512 acc[8], mins[8];
  for (int l = 0; l < 8; ++l) acc[l] = mins[l] = _mm512_setzero_ps();
  for (int64_t j0 = 0; j0 < nb; j0 += 8) {
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) {
      const int64_t j = j0 + l;
      if (j >= nb) break;
      const uint8_t* b = grp + j * kBlockBytes;
      if (prefetch) {  // kAhead blocks ahead: its four code lines, and every other block the line of 32 scales
        for (int t = 0; t < 4; ++t) _mm_prefetch((const char*)(b + kAhead * kBlockBytes + 64 * t), _MM_HINT_T0);
        if (l % 2 == 0) {
          _mm_prefetch((const char*)(gd + (j + kAhead) * kRows), _MM_HINT_T0);
          _mm_prefetch((const char*)(gm + (j + kAhead) * kRows), _MM_HINT_T0);
        }
      }
      __m512i I = _mm512_setzero_si512();
      for (int t = 0; t < 4; ++t) {
        const __m512i raw = _mm512_loadu_si512((const void*)(b + 64 * t));
        int32_t lo, hi;
        std::memcpy(&lo, x + j * kBlock + 4 * t, 4);
        std::memcpy(&hi, x + j * kBlock + 16 + 4 * t, 4);
        I = _mm512_dpbusd_epi32(I, _mm512_and_si512(raw, low), _mm512_set1_epi32(lo));
        I = _mm512_dpbusd_epi32(I, _mm512_and_si512(_mm512_srli_epi16(raw, 4), low), _mm512_set1_epi32(hi));
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(gd + j * kRows)));
      const __m512 zw = _mm512_fmadd_ps(eight, dw, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(gm + j * kRows))));
      const int64_t at = at0 + j;
      acc[l] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(dw, _mm512_set1_ps(a.d[at])), acc[l]);
      mins[l] = _mm512_fmadd_ps(zw, _mm512_set1_ps(a.s[at]), mins[l]);
      mins[l] = _mm512_fnmadd_ps(dw, _mm512_set1_ps(a.c[at]), mins[l]);
    }
  }
  auto pairs = [](const __m512* v) {
    return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v[0], v[4]), _mm512_add_ps(v[2], v[6])),
                         _mm512_add_ps(_mm512_add_ps(v[1], v[5]), _mm512_add_ps(v[3], v[7])));
  };
  _mm512_storeu_ps(out, _mm512_add_ps(pairs(acc), pairs(mins)));
}
#endif

// out[m * 16 + r] = weight row 16 g + r . activation row m, for all M rows (activations in natural order:
// quantize_rows without q4's pair layout). Each activation row reads the group again, from L1 after the first.
inline void group_rows(const uint8_t* qs, const uint16_t* d, const uint16_t* mn, int64_t nb, const QuantAct& a,
                       int64_t M, int64_t g, float* out) {
#ifdef PD_AVX512
  const uint8_t* grp = qs + g * nb * kBlockBytes;
  const uint16_t *gd = d + g * nb * kRows, *gm = mn + g * nb * kRows;
  for (int64_t m = 0; m < M; ++m)
    group_row(grp, gd, gm, nb, a.q.data() + m * nb * kBlock, a, m * a.nbp, m == 0, out + m * kRows);
#else
  group_rows_portable(qs, d, mn, nb, a, M, g, out);
#endif
}

#ifdef PD_AVX2
// The GEMM panel (panel.h's layout) of group g: word t < 4 of a column is the low nibbles of its word t, word
// t + 4 the high ones; dw the scales, zw = fma(8, d, m) as gemm::unpack_panel gives q4 rows.
inline void unpack_panel(const uint8_t* qs, const uint16_t* d, const uint16_t* mn, int64_t nb, int64_t g,
                         gemm::Panel& p) {
  using gemm::kCols;
  static_assert(kCols == kRows, "a q4g group is one GEMM panel");
  p.codes.resize(nb * 8 * kCols);
  p.dw.resize(nb * kCols);
  p.zw.resize(nb * kCols);
  const uint8_t* grp = qs + g * nb * kBlockBytes;
  const uint16_t *gd = d + g * nb * kRows, *gm = mn + g * nb * kRows;
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int64_t j = 0; j < nb; ++j) {
    for (int t = 0; t < 4; ++t)
      for (int h = 0; h < 2; ++h) {
        const __m256i raw = _mm256_loadu_si256((const __m256i*)(grp + j * kBlockBytes + 64 * t + 32 * h));
        _mm256_storeu_si256((__m256i*)(p.codes.data() + (j * 8 + t) * kCols + 8 * h), _mm256_and_si256(raw, low));
        _mm256_storeu_si256((__m256i*)(p.codes.data() + (j * 8 + t + 4) * kCols + 8 * h),
                            _mm256_and_si256(_mm256_srli_epi16(raw, 4), low));
      }
    for (int r = 0; r < kRows; ++r) {
      const float dw = half_to_float(gd[j * kRows + r]);
      p.dw[j * kCols + r] = dw;
      p.zw[j * kCols + r] = std::fma(8.0f, dw, half_to_float(gm[j * kRows + r]));
    }
  }
}
#endif

}  // namespace q4g
}  // namespace pagedeck
