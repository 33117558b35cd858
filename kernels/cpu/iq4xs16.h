// The iq4xs16 format of qmatmul: GGUF IQ4_XS rows regrouped 16 at a time, q6k16.h's scheme for the lookup-table
// family's super-block member: one 512-bit vector holds the same 4 nibble bytes of 16 weight rows, each
// super-block's codes are looked up (u8 v + 128, lut4.h's form) once for all the activation rows of a call, and
// an activation row costs 8 dpbusd a weight row and super-block instead of iq4xs.h's per-row reduction tree.
//
// A group of 16 rows (r = 0..15) stores, per super-block s, kGroupBytes = 16 x 136 bytes (34 lines):
//   [0, 32)       d of the 16 rows (fp16)          [32, 64)  the rows' 2 bytes of high scale bits
//   [64, 128)     the rows' 4 bytes of low scale bits
//   [128, 2176)   the 128 nibble bytes as 32 words k: [128 + 64 k + 4 r, +4) = row r's bytes 8 + 4 k..
// Word k = 4 b + t holds in its low nibbles codes 4t..4t+3 of block b (32 weights), in its high ones codes
// 16+4t..16+4t+3.
//
// The arithmetic is iq4xs.h's exactly: per row and super-block the exact integer I = sum_b (ls_b - 32) S_b with
// S_b = u_b . x_b - 128 bs_b (u = v + 128), then acc = fma(I, d * d_x, acc) a super-block after another. So this
// kernel, iq4xs.h's rows and the GEMM path (panels from the groups) give the same bits. Without AVX-512 each row
// of a group goes through iq4xs.h's tile (the loader keeps IQ4_XS in rows there: kernels.packed.groupable).
#pragma once

#include "activations.h"
#include "common.h"
#include "iq4xs.h"
#include "lut4.h"
#include "panel.h"
#include "row_groups.h"

#include <vector>

namespace pagedeck {
namespace iq4xs16 {

using B = lut4::Iq4xs;
constexpr int kRows = row_groups::kRows;
constexpr int64_t kGroupBytes = kRows * B::kBytes;  // one super-block of a group: 2176 bytes
constexpr int kD = 0, kHighScales = 32, kLowScales = 64, kCodes = 128;

// The group layout (row_groups.h's G): the byte of a group super-block that holds byte `i` (0..135) of row r's
// super-block, as stated above.
struct Group {
  static constexpr int64_t kBytes = B::kBytes, kGroupBytes = iq4xs16::kGroupBytes;
  static constexpr row_groups::Run kRuns[] = {{0, 4, 2}, {4, 136, 4}};
  static int64_t at(int r, int i) {
    if (i < 2) return kD + 2 * r + i;
    if (i < 4) return kHighScales + 2 * r + i - 2;
    if (i < 8) return kLowScales + 4 * r + i - 4;
    return kCodes + 64 * ((i - 8) / 4) + 4 * r + i % 4;
  }
};

#ifdef PD_AVX512
// One group super-block taken apart: codes[8 b + w] = the table values (u8 v + 128) of weights 32 b + 4 w + (0..3)
// of the 16 rows (one int32 lane a row), ls[b] the rows' scale ls - 32 of block b, d their d.
struct Unpacked {
  __m512i codes[64];
  __m512i ls[8];
  __m512 d;
};

// ls[b] = the 16 rows' ls - 32 of block b: its low 4 bits nibble b of the row's low word (byte b / 2, low nibble
// first), its high 2 bits bits 2b of the high half-word; d the rows' d
inline void scales(const uint8_t* g, __m512i ls[8], __m512& d) {
  const __m512i low = _mm512_loadu_si512(g + kLowScales);
  const __m512i high = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(g + kHighScales)));
  d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(g + kD)));
  for (int b = 0; b < 8; ++b) {
    const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(low, 4 * b), _mm512_set1_epi32(0x0F));
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(high, 2 * b), _mm512_set1_epi32(3));
    ls[b] = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), _mm512_set1_epi32(32));
  }
}

inline void unpack(const uint8_t* g, Unpacked& u) {
  const __m512i tab = _mm512_broadcast_i32x4(_mm256_castsi256_si128(lut4::table<B>())), m4 = _mm512_set1_epi8(0x0F);
  for (int k = 0; k < 32; ++k) {
    const int b = k / 4, w = k % 4;
    const __m512i raw = _mm512_loadu_si512(g + kCodes + 64 * k);
    u.codes[8 * b + w] = _mm512_shuffle_epi8(tab, _mm512_and_si512(raw, m4));
    u.codes[8 * b + 4 + w] = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4));
  }
  scales(g, u.ls, u.d);
}

// acc[m] (16 rows) steps over super-block s for activation rows m0..m0+MT, which share each code vector: each
// block's sum from -128 bs_b, then I += (ls_b - 32) times it
template <int MT>
inline void accumulate(const Unpacked& u, const ActK& a, int64_t K, int64_t m0, int64_t s, __m512* acc) {
  const int64_t nsb = K / B::kValues;
  const int8_t* x[MT];
  const int16_t* bs[MT];
  __m512i I[MT];
  for (int r = 0; r < MT; ++r) {
    x[r] = a.q.data() + (m0 + r) * K + s * B::kValues;
    bs[r] = a.bs.data() + ((m0 + r) * nsb + s) * 8;
    I[r] = _mm512_setzero_si512();
  }
  for (int b = 0; b < 8; ++b) {
    __m512i S[MT];
    for (int r = 0; r < MT; ++r) S[r] = _mm512_set1_epi32(-128 * (int32_t)bs[r][b]);
    for (int w = 0; w < 8; ++w) {
      const __m512i c = u.codes[8 * b + w];
      for (int r = 0; r < MT; ++r) {
        int32_t xv;
        std::memcpy(&xv, x[r] + 32 * b + 4 * w, 4);
        S[r] = _mm512_dpbusd_epi32(S[r], c, _mm512_set1_epi32(xv));
      }
    }
    for (int r = 0; r < MT; ++r) I[r] = _mm512_add_epi32(I[r], _mm512_mullo_epi32(S[r], u.ls[b]));
  }
  for (int r = 0; r < MT; ++r) {
    __m512& o = acc[m0 + r];
    o = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r]), _mm512_mul_ps(u.d, _mm512_set1_ps(a.d[(m0 + r) * nsb + s])), o);
  }
}

// One activation row: the same integers and float steps as accumulate<1>, each line's codes used as they are
// looked up (through Unpacked, one-row group calls ran ~18 % slower than the rows' own one-row path)
inline void one_row(const uint8_t* qs, int64_t K, const ActK& a, int64_t g, float* out) {
  const int64_t nsb = K / B::kValues;
  const uint8_t* grp = qs + g * nsb * kGroupBytes;
  const __m512i tab = _mm512_broadcast_i32x4(_mm256_castsi256_si128(lut4::table<B>())), m4 = _mm512_set1_epi8(0x0F);
  __m512 acc = _mm512_setzero_ps(), d;
  __m512i ls[8];
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* gs = grp + s * kGroupBytes;
    row_groups::prefetch<Group>(gs);
    scales(gs, ls, d);
    const int8_t* x = a.q.data() + s * B::kValues;
    const int16_t* bs = a.bs.data() + s * 8;
    __m512i I = _mm512_setzero_si512();
    for (int b = 0; b < 8; ++b) {
      __m512i S = _mm512_set1_epi32(-128 * (int32_t)bs[b]);
      for (int w = 0; w < 4; ++w) {
        const __m512i raw = _mm512_loadu_si512(gs + kCodes + 64 * (4 * b + w));
        int32_t xl, xh;
        std::memcpy(&xl, x + 32 * b + 4 * w, 4);
        std::memcpy(&xh, x + 32 * b + 16 + 4 * w, 4);
        S = _mm512_dpbusd_epi32(S, _mm512_shuffle_epi8(tab, _mm512_and_si512(raw, m4)), _mm512_set1_epi32(xl));
        S = _mm512_dpbusd_epi32(S, _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4)),
                                _mm512_set1_epi32(xh));
      }
      I = _mm512_add_epi32(I, _mm512_mullo_epi32(S, ls[b]));
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(d, _mm512_set1_ps(a.d[s])), acc);
  }
  _mm512_storeu_ps(out, acc);
}

// out[m * 16 + r] = weight row 16 g + r . activation row m, for all M rows
inline void group_rows(const uint8_t* qs, int64_t K, const ActK& a, int64_t M, int64_t g, float* out) {
  if (M == 1) return one_row(qs, K, a, g, out);
  row_groups::group_kernel<Group, Unpacked, 1>(qs, K / B::kValues, M, g, out, unpack,
      [&](auto mt, const Unpacked& u, int64_t m0, int64_t s, __m512* acc) { accumulate<mt>(u, a, K, m0, s, acc); });
}
#else  // each row of the group through iq4xs.h's tile
inline void group_rows(const uint8_t* qs, int64_t K, const ActK& a, int64_t M, int64_t g, float* out) {
  const int64_t nsb = K / B::kValues;
  row_groups::each_row<Group>(qs + g * nsb * kGroupBytes, nsb, M, out, [&](const uint8_t* row, float* col) {
    iq4xs::weight_row(row, K, a, M, 0, col);
  });
}
#endif

#ifdef PD_AVX2
// The GEMM path's panel of group g (iq4xs.h's unpack_panel's meaning of the fields): its 16 rows are the panel's 16
// columns, so block j's word t of every column is one vector of the unpacked group. (Through the rows and iq4xs.h's
// unpacker, the regrouping cost more than the GEMM: 4x its time at 16 rows.)
inline void unpack_panel(const uint8_t* qs, int64_t nb, int64_t g, gemm::Panel& p) {
#ifdef PD_AVX512
  using gemm::kCols;
  static_assert(kCols == kRows, "an iq4xs16 group is one GEMM panel");
  const int64_t nsb = nb / 8;
  const uint8_t* grp = qs + g * nsb * kGroupBytes;
  p.codes.resize(nb * 8 * kCols);
  p.dw.resize(nsb * kCols);
  p.zw.clear();
  p.slo.resize(nb * kCols);
  p.shi.clear();
  thread_local Unpacked u;
  for (int64_t s = 0; s < nsb; ++s) {
    unpack(grp + s * kGroupBytes, u);
    _mm512_storeu_ps(p.dw.data() + s * kCols, u.d);
    for (int b = 0; b < 8; ++b) {
      for (int t = 0; t < 8; ++t)
        _mm512_storeu_si512(p.codes.data() + ((s * 8 + b) * 8 + t) * kCols, u.codes[8 * b + t]);
      _mm512_storeu_si512(p.slo.data() + (s * 8 + b) * kCols, u.ls[b]);
    }
  }
#else
  row_groups::panel_via_rows<Group>(qs, nb, g,
                                    [&](const uint8_t* rows) { iq4xs::unpack_panel(rows, nb, 0, kRows, p); });
#endif
}
#endif

}  // namespace iq4xs16
}  // namespace pagedeck
