// The q3k16 format of qmatmul: GGUF Q3_K rows regrouped 16 at a time, q6k16.h's scheme for Q3_K: one 512-bit
// vector holds the same 4 code bytes of 16 weight rows, so an activation row costs 4 dpbusd a weight row and
// super-block and the 3-bit codes are taken apart once for all the rows of a call (q6.h's rows spend a
// maddubs, a madd and a scale shuffle on every 32 codes of every row: a Q3_K gate|up read ~14 GB/s a core
// from DRAM in rows, ~22 in these groups, where q4k16's read ~35).
//
// A group of 16 rows (r = 0..15) stores, per super-block s, kGroupBytes = 16 x 110 bytes:
//   [0, 1024)     16 lines, line 8 n + w holding row r's 2-bit pair bytes 32 + 32 n + 4 w.. at 4 r
//   [1024, 1536)  8 lines, line w holding row r's hmask bytes 4 w.. at 4 r
//   [1536, 1728)  the twelve scale bytes as [16 k + r] = row r's scale byte k
//   [1728, 1760)  d of the 16 rows (fp16)
// so line (n, w) and hmask line w give, for j = 0..3, the codes of weights 128 n + 32 j + 4 w + (0..3) of all
// 16 rows: pairs at 2 j, the third bit at 4 n + j. They unpack into q6k16's Unpacked (codes 0..7 where Q6_K's
// are 0..63, the sixteen scales decoded to int32 less 32) and q6k16's accumulate runs them with Q3_K's offset
// of 4: the integers q6.h's rows build for Q3_K, so this kernel, the rows and the GEMM path give the same bits.
// Without AVX-512 each row of a group goes through q6.h's tile (the loader keeps Q3_K in rows there).
#pragma once

#include "activations.h"
#include "common.h"
#include "kquant.h"
#include "panel.h"
#include "q6.h"
#include "q6k16.h"
#include "row_groups.h"

namespace pagedeck {
namespace q3k16 {

constexpr int kRows = row_groups::kRows;
constexpr int64_t kGroupBytes = kRows * q3k::kBytes;  // one super-block of a group: 1760 bytes
constexpr int kPairs = 0, kHmask = 1024, kScales = 1536, kD = 1728;

// The group layout (row_groups.h's G): the byte of a group super-block that holds byte `i` (0..109) of row r's
// super-block, as stated above.
struct Group {
  static constexpr int64_t kBytes = q3k::kBytes, kGroupBytes = q3k16::kGroupBytes;
  static constexpr row_groups::Run kRuns[] = {{0, 32, 4}, {32, 96, 4}, {96, 108, 1}, {108, 110, 2}};
  static int64_t at(int r, int i) {
    if (i < q3k::kQs) return kHmask + 64 * (i / 4) + 4 * r + i % 4;
    if (i < q3k::kScales) return kPairs + 64 * ((i - q3k::kQs) / 4) + 4 * r + i % 4;
    if (i < q3k::kD) return kScales + 16 * (i - q3k::kScales) + r;
    return kD + 2 * r + i - q3k::kD;
  }
};

#ifdef PD_AVX512
// The codes: each pair (a shift and a mask) plus 4 where its third bit is set (a byte test into a mask register
// and a masked add: two instructions where shifting the bit into place took four). The scales four at a time:
// bytes k..k+3 of the 16 rows are one 64-byte run, so scales 4 i..4 i + 3 of all rows are one vector (a low or
// high nibble of bytes 0..7, two bits of bytes 8..11), then each 16 of them widened to int32.
inline void unpack(const uint8_t* g, q6k16::Unpacked& u) {
  const __m512i m2 = _mm512_set1_epi8(0x03), four = _mm512_set1_epi8(4);
  for (int w = 0; w < 8; ++w) {
    const __m512i h = _mm512_loadu_si512(g + kHmask + 64 * w);
    for (int n = 0; n < 2; ++n) {
      const __m512i q = _mm512_loadu_si512(g + kPairs + 64 * (8 * n + w));
      for (int j = 0; j < 4; ++j) {
        const __m512i pair = _mm512_and_si512(j ? _mm512_srli_epi16(q, 2 * j) : q, m2);
        const __mmask64 third = _mm512_test_epi8_mask(h, _mm512_set1_epi8((char)(1 << (4 * n + j))));
        u.codes[8 * (4 * n + j) + w] = _mm512_mask_add_epi8(pair, third, pair, four);
      }
    }
  }
  const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(0x03), bias = _mm512_set1_epi8(32);
  const __m512i b03 = _mm512_loadu_si512(g + kScales), b47 = _mm512_loadu_si512(g + kScales + 64),
                b811 = _mm512_loadu_si512(g + kScales + 128);
  const __m512i low[4] = {_mm512_and_si512(b03, m4), _mm512_and_si512(b47, m4),
                          _mm512_and_si512(_mm512_srli_epi16(b03, 4), m4), _mm512_and_si512(_mm512_srli_epi16(b47, 4), m4)};
  for (int i = 0; i < 4; ++i) {  // scales 4 i..4 i + 3: their top bits at 2 i of bytes 8..11
    const __m512i high = _mm512_and_si512(i ? _mm512_srli_epi16(b811, 2 * i) : b811, m3);
    const __m512i sc = _mm512_sub_epi8(_mm512_or_si512(low[i], _mm512_slli_epi16(high, 4)), bias);
    u.sc[4 * i] = _mm512_cvtepi8_epi32(_mm512_castsi512_si128(sc));
    u.sc[4 * i + 1] = _mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(sc, 1));
    u.sc[4 * i + 2] = _mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(sc, 2));
    u.sc[4 * i + 3] = _mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(sc, 3));
  }
  u.d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(g + kD)));
}

// out[m * 16 + r] = weight row 16 g + r . activation row m, for all M rows
inline void group_rows(const uint8_t* qs, int64_t K, const ActK& a, int64_t M, int64_t g, float* out) {
  row_groups::group_kernel<Group, q6k16::Unpacked, 1>(qs, K / q3k::kSuper, M, g, out, unpack,
      [&](auto mt, const q6k16::Unpacked& u, int64_t m0, int64_t s, __m512* acc) {
        q6k16::accumulate<mt, q6::Q3K::kOffsetBits>(u, a, K, m0, s, acc);
      });
}
#else  // each row of the group through q6.h's tile
inline void group_rows(const uint8_t* qs, int64_t K, const ActK& a, int64_t M, int64_t g, float* out) {
  const int64_t nsb = K / q3k::kSuper;
  row_groups::each_row<Group>(qs + g * nsb * kGroupBytes, nsb, M, out, [&](const uint8_t* row, float* col) {
    q6::weight_row<q6::Q3K>(row, K, a, M, 0, col);
  });
}
#endif

#ifdef PD_AVX2
// The GEMM path's panel of group g (q6.h's unpack_panel's meaning of the fields): the group's rows, then q6.h's
// unpacker through Q3_K's layout
inline void unpack_panel(const uint8_t* qs, int64_t nb, int64_t g, gemm::Panel& p) {
  row_groups::panel_via_rows<Group>(qs, nb, g,
                                    [&](const uint8_t* rows) { q6::unpack_panel<q6::Q3K>(rows, nb, 0, kRows, p); });
}
#endif

}  // namespace q3k16
}  // namespace pagedeck
