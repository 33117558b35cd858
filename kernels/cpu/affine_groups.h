// q4g and q5g: the affine nibble family's rows (affine.h: q4 for GGUF Q4_0 / Q4_1, q5 for Q5_0 / Q5_1; 32
// weights a block, fp16 d and m beside the codes) regrouped 16 at a time, so that one 512-bit vector holds the
// same 4 bytes of 16 weight rows and a decode-sized product needs no horizontal reduction. rows.h's per-row tile
// reduces every block's int32 lanes with hadd chains and each row ends in two horizontal sums: on the default
// model's 576-wide q4 rows one core read 16-25 GB/s from cache (23-36 with its rows paired) where the grouped
// K-quants read 42-66.
//
// A group of 16 rows (r = 0..15) of K weights (nb = K / 32 blocks), kBlockBytes a block:
//   qs (N / 16, nb * kBlockBytes) uint8, block j at [kBlockBytes j, ...):
//     [64 t + 4 r, +4), t = 0..3: word t of row r's 16 nibble bytes (GGUF order: low nibbles weights 4t..4t+3,
//         high ones 16+4t..16+4t+3);
//     q5g only, [256 + 4 r, +4): row r's 32 fifth bits (bit i: weight i's, GGUF's qh word);
//   d, m (N / 16, nb * 16) fp16: block j's scale and minimum of row r at 16 j + r (m may be absent: below).
// q4 rows become groups in place (group_in_place; kernels/packed.py's q4_group), q5 rows in torch (q5_group).
//
// The arithmetic is rows.h's dot_tile's, lane for lane: per row and block j the exact int32 sum I of its codes
// (q4: 0..15, q5: 0..31) times the activation's int8 codes, then in lane j % 8 of the row's two accumulators
// acc = fma(I, d_w d_x, acc), mins = fma(z_w, s_x, mins) and mins = fnmadd(d_w, c_x, mins), z_w = fma(c, d_w,
// m_w) with the centre c = 8 (q5: 16, and c_x doubled) (qmatmul.cpp's top comment: the centred product); the
// result is hsum(acc) + hsum(mins) in isa.h's hsum pairing. So a group gives its rows' bits (the per-row and the
// GEMM path alike) whatever the batch, the row order or the threads.
//
// Groups of GGUF Q4_0 and Q5_0 rows may come without minimums (m a null pointer): theirs is m = -c d, w = d (q -
// c), and a token reads the file's bytes (18 a Q4_0 block, not 20). q5g's then leave out the z_w term, which is
// exactly 0 (fma(c, d, -c d)): the rows' bits still, as the Q5_0 rows a model starts on (q5s) give, so settling
// changes no result. q4g's (no Q4_0 model starts on its file) are multiplied as q8 rows (q8.h) of the same
// weights: per block the exact int32 sum of (q - c) x (dpbusd's sum of q x less c times the activations'
// integer sum), acc = fma(I, d_w d_x, acc) in lane j % 8, no minimums, and the GEMM path takes q8's tiles
// (qgemm.h's kCentred, 8 rows a tile where q4 takes 4): a q8 matrix's bits, a few ulp from the rows'.
#pragma once

#include "activations.h"
#include "common.h"
#include "panel.h"

#include <cmath>
#include <cstring>

namespace pagedeck {
namespace affine_groups {

constexpr int kRows = 16;
// Blocks the group kernel prefetches ahead (4 KB of q4 codes): the default model's decode step (2,000 steps of
// Model.forward, alternating) 3.51-3.78 ms two blocks ahead, 3.27-3.29 eight, 2.96-3.07 sixteen, 3.09-3.13
// thirty-two, 3.16-3.19 in rows.
constexpr int64_t kAhead = 16;

struct Q4G {
  static constexpr int64_t kBlockBytes = kRows * 16;  // 256 nibble bytes
  static constexpr bool kFive = false;
  static constexpr float kCentre = 8.0f;
  static constexpr bool kIntegerCentre = true;  // without minimums: q8's arithmetic (above)
};
struct Q5G {
  static constexpr int64_t kBlockBytes = kRows * 20;  // 256 nibble bytes, 64 of fifth bits
  static constexpr bool kFive = true;
  static constexpr float kCentre = 16.0f;
  static constexpr bool kIntegerCentre = false;  // without minimums: the rows' float centring (above)
};

// code i (0..31) of row r in group block b (a block's kBlockBytes)
template <class L>
inline int code(const uint8_t* b, int r, int i) {
  const uint8_t byte = b[64 * ((i & 15) / 4) + 4 * r + (i & 3)];
  const int nibble = i < 16 ? (byte & 15) : (byte >> 4);
  if constexpr (!L::kFive) return nibble;
  uint32_t h;
  std::memcpy(&h, b + 256 + 4 * r, 4);
  return nibble | (int)((h >> i) & 1) << 4;
}

// q4's group g of 16 rows regrouped where they lie: rows and groups hold the same 16 x nb x 16 code bytes and
// 16 x nb scales and minimums (rows' stride nb), only their order differs. tmp: 16 x nb x 16 bytes, tmp_s 2 x 16
// x nb fp16.
inline void group_in_place(uint8_t* codes, uint16_t* scale, uint16_t* minimum, int64_t nb, uint8_t* tmp,
                           uint16_t* tmp_s) {
  std::memcpy(tmp, codes, kRows * nb * 16);
  std::memcpy(tmp_s, scale, kRows * nb * sizeof(uint16_t));
  std::memcpy(tmp_s + kRows * nb, minimum, kRows * nb * sizeof(uint16_t));
  for (int r = 0; r < kRows; ++r)
    for (int64_t j = 0; j < nb; ++j) {
      for (int t = 0; t < 4; ++t)
        std::memcpy(codes + j * Q4G::kBlockBytes + 64 * t + 4 * r, tmp + (r * nb + j) * 16 + 4 * t, 4);
      scale[j * kRows + r] = tmp_s[r * nb + j];
      minimum[j * kRows + r] = tmp_s[kRows * nb + r * nb + j];
    }
}

// hsum's pairing of one row's eight lane accumulators: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))
inline float pair_sum(const float* l) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }

// out[m * 16 + r] = weight row 16 g + r . activation row m, m < M: the statement above, one lane at a time (the
// builds without AVX-512, whose loader keeps q4 and q5 in rows; tests compare it with the vector kernel).
template <class L>
inline void group_rows_portable(const uint8_t* qs, const uint16_t* d, const uint16_t* mn, int64_t nb,
                                const QuantAct& a, int64_t M, int64_t g, float* out) {
  const uint8_t* grp = qs + g * nb * L::kBlockBytes;
  const uint16_t *gd = d + g * nb * kRows, *gm = mn ? mn + g * nb * kRows : nullptr;
  for (int64_t m = 0; m < M; ++m)
    for (int r = 0; r < kRows; ++r) {
      float acc[8] = {}, mins[8] = {};
      for (int64_t j = 0; j < nb; ++j) {
        const int8_t* x = a.q.data() + (m * nb + j) * kBlock;
        int32_t I = 0;
        for (int i = 0; i < kBlock; ++i) I += code<L>(grp + j * L::kBlockBytes, r, i) * x[i];
        const int64_t at = m * a.nbp + j;
        const float dw = half_to_float(gd[j * kRows + r]);
        const int l = (int)(j % 8);
        const float ddx = dw * a.d[at];
        if (!gm && L::kIntegerCentre) {  // q8's sum of (q - c) x
          acc[l] = std::fma((float)(I - (int32_t)L::kCentre * a.isum[at]), ddx, acc[l]);
          continue;
        }
        const float c = L::kFive ? a.c[at] + a.c[at] : a.c[at];  // q5's 16 d_x isum is twice q4's
        acc[l] = std::fma((float)I, ddx, acc[l]);
        if (gm) mins[l] = std::fma(std::fma(L::kCentre, dw, half_to_float(gm[j * kRows + r])), a.s[at], mins[l]);
        mins[l] = std::fma(-dw, c, mins[l]);
      }
      out[m * kRows + r] = pair_sum(acc) + pair_sum(mins);
    }
}

#ifdef PD_AVX512
// The 8 code words of group block b for 16 rows: w < 4 the low nibbles of line w (weights 4w..4w+3), w >= 4 the
// high ones of line w - 4 (weights 16 + 4 (w - 4)..); q5g adds 16 where the weight's fifth bit is set (affine.h's
// q5 unpack: byte k of each row's bits repeated over its 4 bytes, one vptestmb a word).
template <class L>
inline void words(const uint8_t* b, __m512i* w) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int t = 0; t < 4; ++t) {
    const __m512i raw = _mm512_loadu_si512((const void*)(b + 64 * t));
    w[t] = _mm512_and_si512(raw, low);
    w[t + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
  }
  if constexpr (L::kFive) {
    const __m512i h = _mm512_loadu_si512((const void*)(b + 256)), sixteen = _mm512_set1_epi8(16);
    const __m512i lanes = _mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0);
    const __m512i bits_lo = _mm512_set1_epi32(0x08040201), bits_hi = _mm512_set1_epi32((int)0x80402010);
    for (int k = 0; k < 4; ++k) {  // byte k of the bits: weights 8k..8k+7, words 2k (low half) and 2k + 1
      const __m512i rep = _mm512_shuffle_epi8(h, _mm512_add_epi8(lanes, _mm512_set1_epi8((char)k)));
      const int w0 = 2 * k, w1 = 2 * k + 1;  // word t holds weights 4t..4t+3
      w[w0] = _mm512_mask_add_epi8(w[w0], _mm512_test_epi8_mask(rep, bits_lo), w[w0], sixteen);
      w[w1] = _mm512_mask_add_epi8(w[w1], _mm512_test_epi8_mask(rep, bits_hi), w[w1], sixteen);
    }
  }
}

// One activation row x (its K int8 codes; scales, sums and c at a.*[at0 + j]) against group grp: out[r], r < 16.
// Lane l of acc / mins is the accumulator of blocks j = l (mod 8), kept in registers by unrolling 8 blocks.
// kMin: the group has minimums (gm), else m = -c d (above: q4g's integer centring, q5g's float one).
template <class L, bool kMin>
inline void group_row(const uint8_t* grp, const uint16_t* gd, const uint16_t* gm, int64_t nb, const int8_t* x,
                      const QuantAct& a, int64_t at0, bool prefetch, float* out) {
  __m512 acc[8], mins[8];
  for (int l = 0; l < 8; ++l) acc[l] = mins[l] = _mm512_setzero_ps();
  for (int64_t j0 = 0; j0 < nb; j0 += 8) {
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) {
      const int64_t j = j0 + l;
      if (j >= nb) break;
      const uint8_t* b = grp + j * L::kBlockBytes;
      if (prefetch) {  // kAhead blocks ahead: its code lines, and every other block the line of 32 scales
        for (int64_t t = 0; t < L::kBlockBytes; t += 64)
          _mm_prefetch((const char*)(b + kAhead * L::kBlockBytes + t), _MM_HINT_T0);
        if (l % 2 == 0) {
          _mm_prefetch((const char*)(gd + (j + kAhead) * kRows), _MM_HINT_T0);
          if constexpr (kMin) _mm_prefetch((const char*)(gm + (j + kAhead) * kRows), _MM_HINT_T0);
        }
      }
      __m512i w[8];
      words<L>(b, w);
      const int64_t at = at0 + j;
      // q4g without minimums: from -c times the activations' sum, q8's exact sum of (q - c) x
      constexpr bool kInteger = !kMin && L::kIntegerCentre;
      __m512i I = kInteger ? _mm512_set1_epi32(-(int32_t)L::kCentre * a.isum[at]) : _mm512_setzero_si512();
      for (int t = 0; t < 8; ++t) {
        int32_t xw;
        std::memcpy(&xw, x + j * kBlock + 4 * t, 4);
        I = _mm512_dpbusd_epi32(I, w[t], _mm512_set1_epi32(xw));
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(gd + j * kRows)));
      acc[l] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(dw, _mm512_set1_ps(a.d[at])), acc[l]);
      if constexpr (kMin) {
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(gm + j * kRows)));
        const __m512 zw = _mm512_fmadd_ps(_mm512_set1_ps(L::kCentre), dw, m);
        mins[l] = _mm512_fmadd_ps(zw, _mm512_set1_ps(a.s[at]), mins[l]);
      }
      if constexpr (!kInteger) {
        const float c = L::kFive ? a.c[at] + a.c[at] : a.c[at];
        mins[l] = _mm512_fnmadd_ps(dw, _mm512_set1_ps(c), mins[l]);
      }
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
// quantize_rows without the rows' pair layout). Each activation row reads the group again, from L1 after the
// first.
template <class L>
inline void group_rows(const uint8_t* qs, const uint16_t* d, const uint16_t* mn, int64_t nb, const QuantAct& a,
                       int64_t M, int64_t g, float* out) {
#ifdef PD_AVX512
  const uint8_t* grp = qs + g * nb * L::kBlockBytes;
  const uint16_t* gd = d + g * nb * kRows;
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* x = a.q.data() + m * nb * kBlock;
    if (mn) {
      group_row<L, true>(grp, gd, mn + g * nb * kRows, nb, x, a, m * a.nbp, m == 0, out + m * kRows);
    } else {
      group_row<L, false>(grp, gd, nullptr, nb, x, a, m * a.nbp, m == 0, out + m * kRows);
    }
  }
#else
  group_rows_portable<L>(qs, d, mn, nb, a, M, g, out);
#endif
}

#ifdef PD_AVX2
// The GEMM panel (panel.h's layout) of group g: word t of a column as words() gives it, dw the scales, zw =
// fma(centre, d, m), as gemm::unpack_panel gives the rows (0 without minimums; q4g's panel is then kCentred).
template <class L>
inline void unpack_panel(const uint8_t* qs, const uint16_t* d, const uint16_t* mn, int64_t nb, int64_t g,
                         gemm::Panel& p) {
  using gemm::kCols;
  static_assert(kCols == kRows, "a group is one GEMM panel");
  p.codes.resize(nb * 8 * kCols);
  p.dw.resize(nb * kCols);
  p.zw.resize(nb * kCols);
  const uint8_t* grp = qs + g * nb * L::kBlockBytes;
  const uint16_t *gd = d + g * nb * kRows, *gm = mn ? mn + g * nb * kRows : nullptr;
  for (int64_t j = 0; j < nb; ++j) {
    int32_t* dst = p.codes.data() + j * 8 * kCols;
#ifdef PD_AVX512
    __m512i w[8];
    words<L>(grp + j * L::kBlockBytes, w);
    for (int t = 0; t < 8; ++t) _mm512_storeu_si512((void*)(dst + t * kCols), w[t]);
#else
    for (int r = 0; r < kRows; ++r)
      for (int t = 0; t < 8; ++t) {
        uint32_t word = 0;
        for (int i = 0; i < 4; ++i)
          word |= (uint32_t)code<L>(grp + j * L::kBlockBytes, r, (t < 4 ? 4 * t : 16 + 4 * (t - 4)) + i) << (8 * i);
        dst[t * kCols + r] = (int32_t)word;
      }
#endif
    for (int r = 0; r < kRows; ++r) {
      const float dw = half_to_float(gd[j * kRows + r]);
      p.dw[j * kCols + r] = dw;
      p.zw[j * kCols + r] = gm ? std::fma(L::kCentre, dw, half_to_float(gm[j * kRows + r])) : 0.0f;
    }
  }
  // q4g without minimums: the panel is qgemm.h's kCentred (its zw unread)
  p.offset = !gm && L::kIntegerCentre ? (int32_t)L::kCentre : 128;
}
#endif

}  // namespace affine_groups
}  // namespace pagedeck
