// The symmetric 8-bit format q8 (GGUF Q8_0: w = d q, q int8 stored as u8 q + 128 so that dpbusd multiplies
// it, d fp16 per block of 32; rows.h's and qgemm.h's tiles take the + 128 out as 128 * sum(x)) and its grouped
// layout q8g below: the GEMM panel unpacker of q8 rows, and q8g's groups.
//
// q8g: q8 rows regrouped 16 at a time in the GEMM panel's own layout, so that no call
// unpacks them. A q8 GEMM call on row-ordered weights spends most of its time transposing every block of 16
// rows into a panel ([block][4-byte step][row]): on a 262k x 640 output head at 8 activation rows ~15 of ~18
// ms went there, and a decode step with 8 chats pays it every token. Kept in that layout (llama.cpp's CPU
// "repack" buffers interleave Q8_0 rows for the same reason), the tiles read the weights where they lie: on a
// random 262144 x 640 q8 matrix against the same rows in row order (`python -m tools.bench.qmatmul_bench --q8-groups
// 262144x640 --rows 1,2,8 --threads 2`, kernels/PERF.md) 1 row 6.6 -> 6.5 ms, 2 rows 13.3 -> 5.4, 8 rows 16.8
// -> 9.8.
//
// A group of 16 rows (r = 0..15) of K weights (nb = K / 32 blocks):
//   qs (N / 16, nb * 512) uint8: block j's codes at [512 j, 512 j + 512): step t (weights 4t..4t+3 of the
//       block) of row r at 512 j + 64 t + 4 r, stored u8 = q + 128 as q8 stores them;
//   d (N / 16, nb * 16) fp16: block j's scale of row r at 16 j + r.
// Rows become groups in place (group_in_place; kernels/packed.py's q8_group, and q8_ungroup the other way).
// The arithmetic is q8's GEMM tile's (qgemm.h) on these bytes, so results have the same bits as q8 rows' (the
// per-row and GEMM paths alike) whatever the batch.
#pragma once

#include "common.h"
#include "panel.h"

#include <vector>

namespace pagedeck {
namespace q8 {

#ifdef PD_AVX2
// 8 exact int32 partial sums of q8 codes (stored as u8 = q + 128) times s8 activations x: with VNNI, dpbusd's
// sums of u x, and rows.h's dot_tile takes the + 128 out once a block as 128 * isum (kVnni); on AVX2 the codes go back
// to s8 and multiply as |q| * sign(x, q) (isa.h's dot_s8), the sums of q x.
inline __m256i dot(__m256i u, __m256i x) {
  if (kVnni) return dot_u8s8(_mm256_setzero_si256(), u, x);
  const __m256i q = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
  return dot_s8(_mm256_setzero_si256(), q, _mm256_sign_epi8(q, q), x);
}
#endif

#ifdef PD_AVX512
// q8 codes of block j of 16 full columns: word t of a column is its stored dword t (u8 = q + 128), each half
// of 16 bytes through words16. One zmm permute and a lane transpose for what took transpose8's 24 ymm shuffles
// per 8 columns. A q8 panel's unpack is most of an 8-row call on a 262k x 640 head (~15 of ~20 ms): this made
// such calls 1.15x faster (20.8 -> 18.1 ms at 8 rows, alternated in one process; kernels/PERF.md).
inline void unpack_block16(const uint8_t* qs, int64_t nb, int64_t n0, int64_t j, int32_t* dst) {
  for (int h = 0; h < 2; ++h) {
    __m512i T[4];
    gemm::words16(qs + (n0 * nb + j) * 32 + 16 * h, nb * 32, T);
    for (int t = 0; t < 4; ++t) _mm512_storeu_si512((void*)(dst + (t + 4 * h) * gemm::kCols), T[t]);
  }
}
#endif

}  // namespace q8

namespace q8g {

constexpr int kRows = 16;
constexpr int64_t kBlockBytes = kRows * kBlock;  // one block of a group: 512 code bytes

// Group g's 16 rows regrouped where they lie: in both layouts a group's codes are the same 16 x K bytes and its
// scales the same 16 x nb fp16 values (rows' scale stride nb), only their order differs. tmp: 16 x K bytes and
// 16 x nb fp16 of scratch.
inline void group_in_place(uint8_t* codes, uint16_t* scales, int64_t nb, uint8_t* tmp, uint16_t* tmp_scales) {
  std::memcpy(tmp, codes, kRows * nb * kBlock);
  std::memcpy(tmp_scales, scales, kRows * nb * sizeof(uint16_t));
  for (int r = 0; r < kRows; ++r)
    for (int64_t j = 0; j < nb; ++j) {
      const uint8_t* row = tmp + (r * nb + j) * kBlock;
      for (int t = 0; t < 8; ++t) std::memcpy(codes + j * kBlockBytes + 64 * t + 4 * r, row + 4 * t, 4);
      scales[j * kRows + r] = tmp_scales[r * nb + j];
    }
}

#ifdef PD_AVX2
// The tiles' view of group g: its codes where they lie, its scales as fp32 in `dw` (nb x 16 floats; exact).
inline gemm::View view(const uint8_t* qs, const uint16_t* d, int64_t nb, int64_t g, std::vector<float>& dw) {
  dw.resize(nb * kRows);
  const uint16_t* gd = d + g * nb * kRows;
  for (int64_t i = 0; i < nb * kRows; i += 8)
    _mm256_storeu_ps(dw.data() + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(gd + i))));
  return {(const int32_t*)(qs + g * nb * kBlockBytes), dw.data(), dw.data(), nullptr, nullptr};
}
#endif

}  // namespace q8g
}  // namespace pagedeck
