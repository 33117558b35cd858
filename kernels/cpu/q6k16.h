// The q6k16 format of qmatmul: GGUF Q6_K rows regrouped 16 at a time, so that one 512-bit vector holds the same
// 4 code bytes of 16 weight rows and a step of several activation rows shares each unpacked super-block. q6.h's
// rows cost each activation row 16 multiply instructions (maddubs and madd a 32 codes) and a horizontal sum a
// weight row and super-block, so an 8-row step costs nearly 8 one-row calls; here an activation row costs 4
// dpbusd a weight row and super-block, the 6-bit codes taken apart once for all the rows of a call.
//
// A group of 16 rows (r = 0..15) stores, per super-block s, kGroupBytes = 16 x 210 bytes:
//   [0, 3072)     48 lines of 64 bytes, line 3 (8 n + w) + p holding row r's 4 bytes at 4 r:
//                 p = 0: low-nibble bytes 64 n + 4 w.., p = 1: 64 n + 32 + 4 w..,
//                 p = 2: high-pair bytes 128 + 32 n + 4 w..
//   [3072, 3104)  d of the 16 rows (fp16)
//   [3104, 3360)  the sixteen int8 scales as [16 j + r] = row r's sc[j]
// so the three lines of (n, w) give, for k = 0..3, the codes of weights 128 n + 32 k + 4 w + (0..3) of all 16
// rows: one dpbusd against the 4 activation codes broadcast adds them into each row's own int32 lane.
//
// The arithmetic is q6.h's exactly: per row and super-block the exact integer
//   I = sum_h sc_h (q_h . x_h - 32 hs_h)
// (q6.h's, regrouped), then acc = fma(I, d * d_x, acc) a super-block after another. So this kernel, q6.h's rows
// and the GEMM path (panels unpacked from the groups) give the same bits, whatever the batch, row order or
// thread count. Without AVX-512 each row of a group goes through q6.h's own tile (the loader keeps Q6_K in rows
// there: kernels.packed.groupable).
#pragma once

#include "activations.h"
#include "common.h"
#include "kquant.h"
#include "panel.h"
#include "q6.h"
#include "row_groups.h"

#include <vector>

namespace pagedeck {
namespace q6k16 {

constexpr int kRows = row_groups::kRows;
constexpr int64_t kGroupBytes = kRows * q6::kBytes;  // one super-block of a group: 3360 bytes
constexpr int kCodes = 0, kD = 3072, kScales = 3104;

// The group layout (row_groups.h's G): the byte of a group super-block that holds byte `i` (0..209) of row r's
// super-block, as stated above.
struct Group {
  static constexpr int64_t kBytes = q6::kBytes, kGroupBytes = q6k16::kGroupBytes;
  static constexpr row_groups::Run kRuns[] = {{0, 192, 4}, {192, 208, 1}, {208, 210, 2}};
  static int64_t at(int r, int i) {
    if (i < 128) return kCodes + 64 * (3 * (8 * (i / 64) + (i % 32) / 4) + (i % 64) / 32) + 4 * r + i % 4;
    if (i < 192) return kCodes + 64 * (3 * (8 * ((i - 128) / 32) + ((i - 128) % 32) / 4) + 2) + 4 * r + i % 4;
    if (i < 208) return kScales + 16 * (i - 192) + r;
    return kD + 2 * r + i - 208;
  }
};

#ifdef PD_AVX512
// One group super-block taken apart: codes[8 b + w] = the codes of weights 32 b + 4 w + (0..3) of the 16 rows
// (one int32 lane a row), sc[j] the rows' scale j as int32, d their d.
struct Unpacked {
  __m512i codes[64];
  __m512i sc[16];
  __m512 d;
};

inline void unpack(const uint8_t* g, Unpacked& u) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  for (int n = 0; n < 2; ++n)
    for (int w = 0; w < 8; ++w) {
      const uint8_t* line = g + kCodes + 64 * 3 * (8 * n + w);
      const __m512i q0 = _mm512_loadu_si512(line), q1 = _mm512_loadu_si512(line + 64);
      const __m512i h = _mm512_loadu_si512(line + 128);
      // (lo4 & 0x0F) | (hi2 & 0x30): the low nibble and the high pair moved to bits 4-5
      auto join = [&](__m512i lo4, __m512i hi2) {
        return _mm512_or_si512(_mm512_and_si512(lo4, m4), _mm512_and_si512(hi2, m30));
      };
      __m512i* c = u.codes + 8 * 4 * n + w;
      c[0] = join(q0, _mm512_slli_epi16(h, 4));
      c[8] = join(q1, _mm512_slli_epi16(h, 2));
      c[16] = join(_mm512_srli_epi16(q0, 4), h);
      c[24] = join(_mm512_srli_epi16(q1, 4), _mm512_srli_epi16(h, 2));
    }
  for (int j = 0; j < 16; ++j)
    u.sc[j] = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(g + kScales + 16 * j)));
  u.d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(g + kD)));
}

// acc[m] (16 rows) steps over super-block s for activation rows m0..m0+MT, which share each code vector and give
// the core independent dpbusd chains to overlap: each half of 16 from -32 hs_h (the codes' offset: q3k16.h's
// are Q3_K's, offset 4), then I += sc_h times it.
template <int MT, int kOffsetBits = q6::Q6K::kOffsetBits>
inline void accumulate(const Unpacked& u, const ActK& a, int64_t K, int64_t m0, int64_t s, __m512* acc) {
  const int64_t nsb = K / q6::kSuper;
  const int8_t* x[MT];
  const int16_t* hs[MT];
  __m512i I[MT];
  for (int r = 0; r < MT; ++r) {
    x[r] = a.q.data() + (m0 + r) * K + s * q6::kSuper;
    hs[r] = a.hs.data() + ((m0 + r) * nsb + s) * 16;
    I[r] = _mm512_setzero_si512();
  }
  for (int b = 0; b < 8; ++b) {
    __m512i lo[MT], hi[MT];
    for (int r = 0; r < MT; ++r) {
      lo[r] = _mm512_set1_epi32(-(1 << kOffsetBits) * (int32_t)hs[r][2 * b]);
      hi[r] = _mm512_set1_epi32(-(1 << kOffsetBits) * (int32_t)hs[r][2 * b + 1]);
    }
    for (int w = 0; w < 4; ++w) {
      const __m512i cl = u.codes[8 * b + w], ch = u.codes[8 * b + 4 + w];
      for (int r = 0; r < MT; ++r) {
        int32_t xl, xh;
        std::memcpy(&xl, x[r] + 32 * b + 4 * w, 4);
        std::memcpy(&xh, x[r] + 32 * b + 16 + 4 * w, 4);
        lo[r] = _mm512_dpbusd_epi32(lo[r], cl, _mm512_set1_epi32(xl));
        hi[r] = _mm512_dpbusd_epi32(hi[r], ch, _mm512_set1_epi32(xh));
      }
    }
    for (int r = 0; r < MT; ++r)
      I[r] = _mm512_add_epi32(I[r], _mm512_add_epi32(_mm512_mullo_epi32(lo[r], u.sc[2 * b]),
                                                     _mm512_mullo_epi32(hi[r], u.sc[2 * b + 1])));
  }
  for (int r = 0; r < MT; ++r) {
    __m512& o = acc[m0 + r];
    o = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r]), _mm512_mul_ps(u.d, _mm512_set1_ps(a.d[(m0 + r) * nsb + s])), o);
  }
}

// out[m * 16 + r] = weight row 16 g + r . activation row m, for all M rows
inline void group_rows(const uint8_t* qs, int64_t K, const ActK& a, int64_t M, int64_t g, float* out) {
  row_groups::group_kernel<Group, Unpacked, 1>(qs, K / q6::kSuper, M, g, out, unpack,
      [&](auto mt, const Unpacked& u, int64_t m0, int64_t s, __m512* acc) { accumulate<mt>(u, a, K, m0, s, acc); });
}
#else  // each row of the group through q6.h's tile
inline void group_rows(const uint8_t* qs, int64_t K, const ActK& a, int64_t M, int64_t g, float* out) {
  const int64_t nsb = K / q6::kSuper;
  row_groups::each_row<Group>(qs + g * nsb * kGroupBytes, nsb, M, out, [&](const uint8_t* row, float* col) {
    q6::weight_row(row, K, a, M, 0, col);
  });
}
#endif

#ifdef PD_AVX2
// The GEMM path's panel of group g (q6.h's unpack_panel's meaning of the fields): its 16 rows are the panel's
// 16 columns, so a block's word t of every column is one vector of the unpacked group.
inline void unpack_panel(const uint8_t* qs, int64_t nb, int64_t g, gemm::Panel& p) {
  using gemm::kCols;
  static_assert(kCols == kRows, "a q6k16 group is one GEMM panel");
  const int64_t nsb = nb / 8;
  const uint8_t* grp = qs + g * nsb * kGroupBytes;
  p.codes.resize(nb * 8 * kCols);
  p.dw.resize(nsb * kCols);
  p.zw.clear();
  p.slo.resize(nb * kCols);
  p.shi.resize(nb * kCols);
#ifdef PD_AVX512
  thread_local Unpacked u;
  for (int64_t s = 0; s < nsb; ++s) {
    unpack(grp + s * kGroupBytes, u);
    _mm512_storeu_ps(p.dw.data() + s * kCols, u.d);
    for (int b = 0; b < 8; ++b) {
      for (int t = 0; t < 8; ++t)
        _mm512_storeu_si512(p.codes.data() + ((s * 8 + b) * 8 + t) * kCols, u.codes[8 * b + t]);
      const int64_t at = (s * 8 + b) * kCols;
      _mm512_storeu_si512(p.slo.data() + at, u.sc[2 * b]);
      _mm512_storeu_si512(p.shi.data() + at, u.sc[2 * b + 1]);
    }
  }
#else  // the group's rows, then q6.h's unpacker
  row_groups::panel_via_rows<Group>(qs, nb, g, [&](const uint8_t* rows) { q6::unpack_panel(rows, nb, 0, kRows, p); });
#endif
}
#endif

}  // namespace q6k16
}  // namespace pagedeck
