// The q4k16 format of qmatmul: GGUF Q4_K rows regrouped 16 at a time, so that one vector holds the same
// bytes of 16 weight rows and a decode-sized product needs no horizontal reduction. q4k.h's per-row kernel
// reduces each super-block's int32 lanes to one I and one J (hadd chains): ~35 cycles a super-block from L2,
// this one ~17 (one core, one activation row); llama.cpp's CPU "repack" buffers interleave Q4_K rows 8 at a
// time at load for the same reason. A 64-byte line holds word k of all 16 rows and the kernel reads the lines
// in address order (both halves of a line before the next), so the weight stream stays sequential.
//
// A group of 16 rows (r = 0..15) stores, per super-block s, kGroupBytes = 16 x 144 bytes:
//   [0, 32)      d of the 16 rows (fp16)          [32, 64)  dmin of the 16 rows (fp16)
//   [64, 256)    the 12 scale bytes as three 4-byte words w: [64 + 64 w + 4 r, +4) = row r's bytes 4+4w..
//   [256, 2304)  the 128 nibble bytes as 32 4-byte words k: [256 + 64 k + 4 r, +4) = row r's bytes 16+4k..
// so a 32-byte load of word k gives 8 rows' 4 bytes each: their low nibbles are codes t..t+3 (t = 4 (k % 8))
// of sub-block 2 (k / 8), the high ones the same codes of sub-block 2 (k / 8) + 1, and one dpbusd against the
// 4 activation codes broadcast adds them into each row's own int32 lane.
//
// The arithmetic is q4k.h's exactly: per row and super-block the exact integers I = sum_b sc_b (q_b . x_b) and
// J = sum_b m_b bs_b, then q4k::step's fp32 chain (fma(I, d dx), then fnmadd(J, dmin dx)), lane-wise. So this
// per-row kernel, q4k.h's (on the same rows in row order) and the GEMM path (panels unpacked from the groups)
// give the same bits, whatever the batch, row order or thread count.
#pragma once

#include "common.h"
#include "q4k.h"
#include "panel.h"
#include "row_groups.h"

namespace pagedeck {
namespace q4k16 {

constexpr int kRows = row_groups::kRows;
constexpr int64_t kGroupBytes = kRows * q4k::kBytes;  // one super-block of a group: 2304 bytes
constexpr int kD = 0, kDmin = 32, kScales = 64, kCodes = 256;

// The group layout (row_groups.h's G): the byte of a group super-block that holds byte `i` (0..143) of row r's
// super-block, as stated above.
struct Group {
  static constexpr int64_t kBytes = q4k::kBytes, kGroupBytes = q4k16::kGroupBytes;
  static constexpr row_groups::Run kRuns[] = {{0, 4, 2}, {4, 144, 4}};
  static int64_t at(int r, int i) {
    if (i < 2) return kD + 2 * r + i;
    if (i < 4) return kDmin + 2 * r + i - 2;
    if (i < 16) return kScales + 64 * ((i - 4) / 4) + 4 * r + (i - 4) % 4;
    return kCodes + 64 * ((i - 16) / 4) + 4 * r + (i - 16) % 4;
  }
};

#ifdef PD_AVX2
// out[m * 16 + r] = weight row 16 g + r . activation row m0 + m, m < MT. Per super-block, each half h of the
// group (rows 8h..8h+7, one 32-byte vector) has its J first (four int16-pair multiply-adds of the rows'
// minimums against the activation's bs pairs); then each 64-byte line of codes (word k: both halves, read in
// address order, so the stream stays sequential) gives 2 x 2 dpbusd into per-sub-block sums, and I += sc_b
// sums (vpmullo) per sub-block pair. At most 2 activation rows a tile: 4 would spill the registers.
template <int MT>
inline void group_tile(const uint8_t* grp, int64_t nsb, const ActK& a, int64_t K, int64_t m0, float* out) {
  static_assert(MT <= 2, "q4k16 tiles take 1 or 2 activation rows");
  __m256 acc[MT][2];
  for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), k1 = _mm256_set1_epi32(0x3f3f3f3f), k2 = _mm256_set1_epi32(0x0f0f0f0f),
                k3 = _mm256_set1_epi32(0x03030303), even = _mm256_set1_epi32(0x00ff00ff);
  const __m256i lane4 = _mm256_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12);
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* g = grp + s * kGroupBytes;
    row_groups::prefetch<Group>(g);

    __m256i sc[2][2], J[MT][2], I[MT][2];
    for (int h = 0; h < 2; ++h) {
      const __m256i u0 = _mm256_loadu_si256((const __m256i*)(g + kScales + 32 * h));
      const __m256i u1 = _mm256_loadu_si256((const __m256i*)(g + kScales + 64 + 32 * h));
      const __m256i u2 = _mm256_loadu_si256((const __m256i*)(g + kScales + 128 + 32 * h));
      sc[h][0] = _mm256_and_si256(u0, k1);
      sc[h][1] = _mm256_or_si256(_mm256_and_si256(u2, k2),
                                 _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), k3), 4));
      const __m256i m03 = _mm256_and_si256(u1, k1);
      const __m256i m47 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), k2),
                                          _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), k3), 4));
      const __m256i mw[4] = {_mm256_and_si256(m03, even), _mm256_srli_epi16(m03, 8), _mm256_and_si256(m47, even),
                             _mm256_srli_epi16(m47, 8)};
      for (int m = 0; m < MT; ++m) {
        const int16_t* bs = a.bs.data() + ((m0 + m) * nsb + s) * 8;
        J[m][h] = I[m][h] = _mm256_setzero_si256();
        for (int i = 0; i < 4; ++i) {  // minimums (2i', 2i'+2) or (2i'+1, 2i'+3) against bs pairs (0, 2), (1, 3), ...
          const int lo = (i / 2) * 4 + i % 2;
          const int32_t pair = (int32_t)((uint16_t)bs[lo] | (uint32_t)(uint16_t)bs[lo + 2] << 16);
          J[m][h] = madd_acc(J[m][h], mw[i], _mm256_set1_epi32(pair));
        }
      }
    }
    for (int c = 0; c < 4; ++c) {
      __m256i lo[MT][2], hi[MT][2];
      for (int m = 0; m < MT; ++m) lo[m][0] = lo[m][1] = hi[m][0] = hi[m][1] = _mm256_setzero_si256();
      for (int t = 0; t < 8; ++t) {
        __m256i xl[MT], xh[MT];
        for (int m = 0; m < MT; ++m) {
          const int8_t* x = a.q.data() + (m0 + m) * K + s * q4k::kSuper + 64 * c + 4 * t;
          int32_t l, u;
          std::memcpy(&l, x, 4);
          std::memcpy(&u, x + 32, 4);
          xl[m] = _mm256_set1_epi32(l);
          xh[m] = _mm256_set1_epi32(u);
        }
        for (int h = 0; h < 2; ++h) {
          const __m256i raw = _mm256_loadu_si256((const __m256i*)(g + kCodes + 64 * (8 * c + t) + 32 * h));
          const __m256i wl = _mm256_and_si256(raw, m4), wh = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
          for (int m = 0; m < MT; ++m) {
            lo[m][h] = dot_u8s8(lo[m][h], wl, xl[m]);
            hi[m][h] = dot_u8s8(hi[m][h], wh, xh[m]);
          }
        }
      }
      const int b = 2 * c;  // sc_b of each row: byte b % 4 of its lane in sc[h][b / 4]
      const __m256i pick_l = _mm256_add_epi32(lane4, _mm256_set1_epi32(0x80808000 | (b % 4)));
      const __m256i pick_h = _mm256_add_epi32(lane4, _mm256_set1_epi32(0x80808000 | (b % 4 + 1)));
      for (int h = 0; h < 2; ++h) {
        const __m256i sl = _mm256_shuffle_epi8(sc[h][b / 4], pick_l), sh = _mm256_shuffle_epi8(sc[h][b / 4], pick_h);
        for (int m = 0; m < MT; ++m)
          I[m][h] = _mm256_add_epi32(I[m][h], _mm256_add_epi32(_mm256_mullo_epi32(lo[m][h], sl),
                                                               _mm256_mullo_epi32(hi[m][h], sh)));
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(g + kD + 16 * h)));
      const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(g + kDmin + 16 * h)));
      for (int m = 0; m < MT; ++m) {
        const __m256 dx = _mm256_set1_ps(a.d[(m0 + m) * nsb + s]);
        acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[m][h]), _mm256_mul_ps(d, dx), acc[m][h]);
        acc[m][h] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(J[m][h]), _mm256_mul_ps(dm, dx), acc[m][h]);
      }
    }
  }
  for (int m = 0; m < MT; ++m) {
    _mm256_storeu_ps(out + m * kRows, acc[m][0]);
    _mm256_storeu_ps(out + m * kRows + 8, acc[m][1]);
  }
}
#else  // portable: each row of the group through q4k's portable tile
template <int MT>
inline void group_tile(const uint8_t* grp, int64_t nsb, const ActK& a, int64_t K, int64_t m0, float* out) {
  row_groups::each_row<Group>(grp, nsb, MT, out, [&](const uint8_t* row, float* col) {
    q4k::tile<MT>(row, nsb, a, K, m0, col);
  });
}
#endif

// out[m * 16 + r] = weight row 16 g + r . activation row m, for all M rows (2 activation rows a tile)
inline void group_rows(const uint8_t* qs, int64_t K, const ActK& a, int64_t M, int64_t g, float* out) {
  const int64_t nsb = K / q4k::kSuper;
  const uint8_t* grp = qs + g * nsb * kGroupBytes;
  int64_t m = 0;
  for (; m + 2 <= M; m += 2) group_tile<2>(grp, nsb, a, K, m, out + m * kRows);
  for (; m < M; ++m) group_tile<1>(grp, nsb, a, K, m, out + m * kRows);
}

#ifdef PD_AVX2
// The GEMM path's panel (q4k.h's unpack_panel's meaning of the fields) of group g: its 16 rows are the
// panel's 16 columns, so a code vector is one load of a 4-byte word and a mask or shift.
inline void unpack_panel(const uint8_t* qs, int64_t nb, int64_t g, gemm::Panel& p) {
  using gemm::kCols;
  static_assert(kCols == kRows, "a q4k16 group is one GEMM panel");
  const int64_t nsb = nb / 8;
  const uint8_t* grp = qs + g * nsb * kGroupBytes;
  p.codes.resize(nb * 8 * kCols);
  p.dw.resize(nsb * kCols);
  p.zw.resize(nsb * kCols);
  p.slo.resize(nb * kCols);
  p.shi.resize(nsb * 4 * kCols);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* gs = grp + s * kGroupBytes;
    for (int c = 0; c < 4; ++c)
      for (int t = 0; t < 8; ++t)
        for (int h = 0; h < 2; ++h) {
          const __m256i raw = _mm256_loadu_si256((const __m256i*)(gs + kCodes + 64 * (8 * c + t) + 32 * h));
          const int64_t j = 8 * s + 2 * c;
          _mm256_storeu_si256((__m256i*)(p.codes.data() + (j * 8 + t) * kCols + 8 * h), _mm256_and_si256(raw, m4));
          _mm256_storeu_si256((__m256i*)(p.codes.data() + ((j + 1) * 8 + t) * kCols + 8 * h),
                              _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
        }
    for (int r = 0; r < kRows; ++r) {
      uint8_t sb[16];  // the row's d, dmin and scale bytes, as its super-block starts
      for (int i = 0; i < 16; ++i) sb[i] = gs[Group::at(r, i)];
      q4k::panel_scales(sb, s, r, p);
    }
  }
}
#endif

}  // namespace q4k16
}  // namespace pagedeck
