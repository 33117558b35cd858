// The q5k16 format of qmatmul: GGUF Q5_K rows regrouped 16 at a time, q6k16.h's scheme for Q5_K: one 512-bit
// vector holds the same 4 code bytes of 16 weight rows, each super-block's 5-bit codes are taken apart once for
// all the activation rows of a call, and an activation row costs 8 dpbusd a weight row and super-block. Q5_K's
// rows (q4k.h through Q5_K's layout) reduce each super-block's lanes per row and activation row, so an 8-row
// step cost nearly 8 one-row calls.
//
// A group of 16 rows (r = 0..15) stores, per super-block s, kGroupBytes = 16 x 176 bytes (44 lines):
//   [0, 32)       d of the 16 rows (fp16)          [32, 64)  dmin of the 16 rows (fp16)
//   [64, 256)     the 12 scale bytes as three 4-byte words w: [64 + 64 w + 4 r, +4) = row r's bytes 4 + 4 w..
//   [256, 768)    the 32 fifth-bit bytes as 8 words t: [256 + 64 t + 4 r, +4) = row r's bytes 16 + 4 t..
//   [768, 2816)   the 128 nibble bytes as 32 words k: [768 + 64 k + 4 r, +4) = row r's bytes 48 + 4 k..
// Word k = 8 c + t of the nibbles holds, in its low nibbles, codes 4t..4t+3 of sub-block 2c and in its high ones
// those of sub-block 2c + 1; fifth-bit word t holds their fifth bits (bit b for sub-block b).
//
// The arithmetic is q4k.h's exactly: per row and super-block the exact integers I = sum_b sc_b (q_b . x_b) and
// J = sum_b m_b bs_b, then kquant.h's step (fma(I, d dx), then fnmadd(J, dmin dx)), lane-wise. So this kernel,
// the rows' kernel and the GEMM path (panels unpacked from the groups) give the same bits, whatever the batch,
// row order or thread count. Without AVX-512 each row of a group goes through the rows' tile (the loader keeps
// Q5_K in rows there: kernels.packed.groupable).
#pragma once

#include "activations.h"
#include "common.h"
#include "kquant.h"
#include "panel.h"
#include "q4k.h"
#include "row_groups.h"

#include <vector>

namespace pagedeck {
namespace q5k16 {

using L = q4k::Q5K;
constexpr int kRows = row_groups::kRows;
constexpr int64_t kGroupBytes = kRows * L::kBytes;  // one super-block of a group: 2816 bytes
constexpr int kD = 0, kDmin = 32, kScales = 64, kHigh = 256, kCodes = 768;

// The group layout (row_groups.h's G): the byte of a group super-block that holds byte `i` (0..175) of row r's
// super-block, as stated above.
struct Group {
  static constexpr int64_t kBytes = L::kBytes, kGroupBytes = q5k16::kGroupBytes;
  static constexpr row_groups::Run kRuns[] = {{0, 4, 2}, {4, 176, 4}};
  static int64_t at(int r, int i) {
    if (i < 2) return kD + 2 * r + i;
    if (i < 4) return kDmin + 2 * r + i - 2;
    if (i < 16) return kScales + 64 * ((i - 4) / 4) + 4 * r + i % 4;
    if (i < 48) return kHigh + 64 * ((i - 16) / 4) + 4 * r + i % 4;
    return kCodes + 64 * ((i - 48) / 4) + 4 * r + i % 4;
  }
};

#ifdef PD_AVX512
// One group super-block taken apart: codes[8 b + t] = codes 4t..4t+3 of sub-block b of the 16 rows (one int32
// lane a row), sc[b] / mn[b] the rows' 6-bit scale and minimum b as int32, d / dmin theirs.
struct Unpacked {
  __m512i codes[64];
  __m512i sc[8], mn[8];
  __m512 d, dmin;
};

inline void unpack(const uint8_t* g, Unpacked& u) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
  for (int t = 0; t < 8; ++t) {
    const __m512i qh = _mm512_loadu_si512(g + kHigh + 64 * t);
    for (int c = 0; c < 4; ++c) {
      const __m512i raw = _mm512_loadu_si512(g + kCodes + 64 * (8 * c + t));
      const __m512i lo = _mm512_and_si512(raw, m4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
      const __mmask64 blo = _mm512_test_epi8_mask(qh, _mm512_set1_epi8((char)(1 << (2 * c))));
      const __mmask64 bhi = _mm512_test_epi8_mask(qh, _mm512_set1_epi8((char)(1 << (2 * c + 1))));
      u.codes[8 * (2 * c) + t] = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(blo, sixteen));
      u.codes[8 * (2 * c + 1) + t] = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(bhi, sixteen));
    }
  }
  // ggml's kmask regrouping (kquant.h's scales), 16 rows at once
  const __m512i k1 = _mm512_set1_epi32(0x3f3f3f3f), k2 = _mm512_set1_epi32(0x0f0f0f0f);
  const __m512i k3 = _mm512_set1_epi32(0x03030303);
  const __m512i u0 = _mm512_loadu_si512(g + kScales), u1 = _mm512_loadu_si512(g + kScales + 64);
  const __m512i u2 = _mm512_loadu_si512(g + kScales + 128);
  const __m512i s03 = _mm512_and_si512(u0, k1), m03 = _mm512_and_si512(u1, k1);
  const __m512i s47 = _mm512_or_si512(_mm512_and_si512(u2, k2),
                                      _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), k3), 4));
  const __m512i m47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), k2),
                                      _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), k3), 4));
  const __m512i byte = _mm512_set1_epi32(0xFF);
  for (int b = 0; b < 4; ++b) {
    u.sc[b] = _mm512_and_si512(_mm512_srli_epi32(s03, 8 * b), byte);
    u.sc[b + 4] = _mm512_and_si512(_mm512_srli_epi32(s47, 8 * b), byte);
    u.mn[b] = _mm512_and_si512(_mm512_srli_epi32(m03, 8 * b), byte);
    u.mn[b + 4] = _mm512_and_si512(_mm512_srli_epi32(m47, 8 * b), byte);
  }
  u.d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(g + kD)));
  u.dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(g + kDmin)));
}

// acc[m] (16 rows) steps over super-block s for activation rows m0..m0+MT, which share each code vector.
template <int MT>
inline void accumulate(const Unpacked& u, const ActK& a, int64_t K, int64_t m0, int64_t s, __m512* acc) {
  const int64_t nsb = K / q4k::kSuper;
  const int8_t* x[MT];
  __m512i I[MT], J[MT];
  for (int r = 0; r < MT; ++r) {
    x[r] = a.q.data() + (m0 + r) * K + s * q4k::kSuper;
    const int16_t* bs = a.bs.data() + ((m0 + r) * nsb + s) * 8;
    I[r] = _mm512_setzero_si512();
    J[r] = _mm512_mullo_epi32(u.mn[0], _mm512_set1_epi32(bs[0]));
    for (int b = 1; b < 8; ++b) J[r] = _mm512_add_epi32(J[r], _mm512_mullo_epi32(u.mn[b], _mm512_set1_epi32(bs[b])));
  }
  for (int b = 0; b < 8; ++b) {
    __m512i t[MT];
    for (int r = 0; r < MT; ++r) t[r] = _mm512_setzero_si512();
    for (int w = 0; w < 8; ++w) {
      const __m512i c = u.codes[8 * b + w];
      for (int r = 0; r < MT; ++r) {
        int32_t xv;
        std::memcpy(&xv, x[r] + 32 * b + 4 * w, 4);
        t[r] = _mm512_dpbusd_epi32(t[r], c, _mm512_set1_epi32(xv));
      }
    }
    for (int r = 0; r < MT; ++r) I[r] = _mm512_add_epi32(I[r], _mm512_mullo_epi32(t[r], u.sc[b]));
  }
  for (int r = 0; r < MT; ++r) {
    const __m512 dx = _mm512_set1_ps(a.d[(m0 + r) * nsb + s]);
    __m512& o = acc[m0 + r];
    o = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r]), _mm512_mul_ps(u.d, dx), o);
    o = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(J[r]), _mm512_mul_ps(u.dmin, dx), o);
  }
}

// out[m * 16 + r] = weight row 16 g + r . activation row m, for all M rows
inline void group_rows(const uint8_t* qs, int64_t K, const ActK& a, int64_t M, int64_t g, float* out) {
  row_groups::group_kernel<Group, Unpacked, 1>(qs, K / q4k::kSuper, M, g, out, unpack,
      [&](auto mt, const Unpacked& u, int64_t m0, int64_t s, __m512* acc) { accumulate<mt>(u, a, K, m0, s, acc); });
}
#else  // each row of the group through the rows' tile
inline void group_rows(const uint8_t* qs, int64_t K, const ActK& a, int64_t M, int64_t g, float* out) {
  const int64_t nsb = K / q4k::kSuper;
  row_groups::each_row<Group>(qs + g * nsb * kGroupBytes, nsb, M, out, [&](const uint8_t* row, float* col) {
    q4k::weight_row<L>(row, K, a, M, 0, col);
  });
}
#endif

#ifdef PD_AVX2
// The GEMM path's panel of group g: its 16 rows, then q4k.h's Q5_K unpacker (prompt rows are few next to a
// panel's reuse, so the regrouping back costs little there).
inline void unpack_panel(const uint8_t* qs, int64_t nb, int64_t g, gemm::Panel& p) {
  row_groups::panel_via_rows<Group>(qs, nb, g,
                                    [&](const uint8_t* rows) { q4k::unpack_panel<L>(rows, nb, 0, kRows, p); });
}
#endif

}  // namespace q5k16
}  // namespace pagedeck
