// The q6 format of qmatmul: GGUF Q6_K super-blocks kept as the file stores them (210 bytes a 256 weights: 128
// bytes of low nibbles, 64 of high 2-bit pairs, sixteen int8 scales, fp16 d), w = d * sc[i / 16] * (q - 32).
// Re-quantizing them to q8 (as pagedeck did) cost 8.5 bits a weight instead of 6.56, and batch-1 decode
// streams every weight once a token.
//
// Per 32-weight block b of a super-block the integer sum is exact:
//   S_b = sc[2b] * sum_{i<16} q_i x_i + sc[2b+1] * sum_{i>=16} q_i x_i - 32 * (sc[2b] xs[2b] + sc[2b+1] xs[2b+1])
// with x the int8 activations and xs their sums per 16 (quantize_rows); a super-block is one group of 8 blocks
// of the q8 kernel, so the float part is q8's: acc (lane b) = fma(S_b, d * d_x[b], acc), result hsum(acc) +
// hsum(0). The same sequence for every (row, column), whatever the tile or thread split, so results never
// depend on the batch; prompt rows (qgemm.h) compute the same integers and the same float sequence.
#pragma once

#include "common.h"
#include "kquant.h"
#include "panel.h"

namespace pagedeck {
namespace q6 {

#ifdef PD_AVX2
// out[r] = weight row n . activation rows m0..m0+MT (xq: int8 (M, K) natural order; dx: scales (M, nbp);
// xs: int16 sums per 16 (M, 2 nbp)).
template <int MT>
inline void tile(const uint8_t* row, int64_t nsb, const int8_t* xq, const float* dx, const int16_t* xs, int64_t K,
                 int64_t nbp, int64_t m0, float* out) {
  __m256 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = row + s * kBytes;
    for (int b = 0; b < 256; b += 64) _mm_prefetch((const char*)sb + kPrefetch + b, _MM_HINT_T0);
    const __m128i sc8 = _mm_loadu_si128((const __m128i*)(sb + 192));
    __m256i half[MT][2];
    for (int n = 0; n < 2; ++n) {
      __m256i c[4];
      half_codes(sb, n, c);
      __m256i sc[4];
      for (int k = 0; k < 4; ++k) sc[k] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, scale_shuffle(4 * n + k)));
      for (int r = 0; r < MT; ++r) {
        const int8_t* x = xq + (m0 + r) * K + s * kSuper + 128 * n;
        __m256i v[4];
        for (int k = 0; k < 4; ++k)
          v[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(c[k], _mm256_loadu_si256((const __m256i*)(x + 32 * k))),
                                   sc[k]);
        // [A0 A1 A2 A3 | B0 B1 B2 B3]: A_k = lanes 0-3 of block k (its first 16 weights), B_k lanes 4-7
        half[r][n] = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
      }
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    const __m256 d = _mm256_set1_ps(scale_d(sb));
    for (int r = 0; r < MT; ++r) {
      const __m256i lo = _mm256_permute2x128_si256(half[r][0], half[r][1], 0x20);
      const __m256i hi = _mm256_permute2x128_si256(half[r][0], half[r][1], 0x31);
      const int64_t at = (m0 + r) * nbp + s * 8;
      const __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i*)(xs + 2 * at)));
      const __m256i sums = _mm256_sub_epi32(_mm256_add_epi32(lo, hi), _mm256_slli_epi32(corr, 5));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(d, _mm256_loadu_ps(dx + at)), acc[r]);
    }
  }
  for (int r = 0; r < MT; ++r) out[r] = hsum(acc[r]) + hsum(_mm256_setzero_ps());
}
#else  // portable: the same integers, scaled block by block
template <int MT>
inline void tile(const uint8_t* row, int64_t nsb, const int8_t* xq, const float* dx, const int16_t* xs, int64_t K,
                 int64_t nbp, int64_t m0, float* out) {
  for (int r = 0; r < MT; ++r) {
    float acc = 0.0f;
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* sb = row + s * kBytes;
      const int8_t* sc = (const int8_t*)(sb + 192);
      const float d = scale_d(sb);
      for (int b = 0; b < 8; ++b) {
        int32_t sum = 0;
        for (int i = 0; i < 32; ++i)
          sum += sc[2 * b + i / 16] * (code(sb, 32 * b + i) - 32) * xq[(m0 + r) * K + s * kSuper + 32 * b + i];
        acc += (float)sum * (d * dx[(m0 + r) * nbp + s * 8 + b]);
      }
    }
    (void)xs;
    out[r] = acc;
  }
}
#endif

// out[m] = weight row n . activation row m, 4 activation rows sharing each unpacked super-block
inline void weight_row(const uint8_t* qs, int64_t K, const int8_t* xq, const float* dx, const int16_t* xs, int64_t nbp,
                       int64_t M, int64_t n, float* out) {
  const int64_t nsb = K / kSuper;
  const uint8_t* row = qs + n * nsb * kBytes;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile<4>(row, nsb, xq, dx, xs, K, nbp, m, out + m);
  for (; m < M; ++m) tile<1>(row, nsb, xq, dx, xs, K, nbp, m, out + m);
}

#ifdef PD_AVX2
// The GEMM path's q6 panel (qgemm.h's unpack_panel sizes it, its tiles read it): one pass over each
// super-block of a column (its 192 code bytes read once, as tile reads them, instead of 64 bytes per block and
// a variable shift), the 8 blocks of 8 columns transposed together; d converted once per super-block instead
// of once per block. The same codes and scales as the per-row tile: codes 0..63, dw the super-block's d,
// slo / shi the int8 scales of the block's two halves of 16.
inline void unpack_panel(const uint8_t* qs, int64_t nb, int64_t n0, int cols, gemm::Panel& p) {
  using gemm::kCols;
  const int64_t nsb = nb / 8, q6row = nsb * kBytes;
  for (int g = 0; g < kCols; g += 8) {
    for (int64_t s = 0; s < nsb; ++s) {
      __m256i blk[8][8];  // [block of the super-block][column]
      for (int c = 0; c < 8; ++c) {
        if (g + c >= cols) {
          for (int b = 0; b < 8; ++b) blk[b][c] = _mm256_setzero_si256();
          continue;
        }
        const uint8_t* sb = qs + (n0 + g + c) * q6row + s * kBytes;
        for (int n = 0; n < 2; ++n) {
          __m256i c4[4];
          half_codes(sb, n, c4);
          for (int k = 0; k < 4; ++k) blk[4 * n + k][c] = c4[k];
        }
      }
      for (int b = 0; b < 8; ++b) {
        gemm::transpose8(blk[b]);
        int32_t* dst = p.codes.data() + (s * 8 + b) * 8 * kCols + g;
        for (int t = 0; t < 8; ++t) _mm256_storeu_si256((__m256i*)(dst + t * kCols), blk[b][t]);
      }
    }
  }
  int c0 = 0;  // full groups of 8 columns: the scales' bytes gathered one dword (sc[2b], sc[2b + 1], ...) a column
  for (; c0 + 8 <= cols; c0 += 8) {
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)q6row));
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* base = qs + (n0 + c0) * q6row + s * kBytes;
      // bytes 206..209: sc[14], sc[15] and d (never read past the super-block)
      const __m256i top = _mm256_i32gather_epi32((const int*)(base + 206), idx, 1);
      const __m256i dh = _mm256_srli_epi32(top, 16);
      const __m256 d = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(dh), _mm256_extracti128_si256(dh, 1)));
      for (int b = 0; b < 8; ++b) {
        const __m256i x = b == 7 ? top : _mm256_i32gather_epi32((const int*)(base + 192 + 2 * b), idx, 1);
        const int64_t at = (s * 8 + b) * kCols + c0;
        _mm256_storeu_ps(p.dw.data() + at, d);
        _mm256_storeu_si256((__m256i*)(p.slo.data() + at), _mm256_srai_epi32(_mm256_slli_epi32(x, 24), 24));
        _mm256_storeu_si256((__m256i*)(p.shi.data() + at), _mm256_srai_epi32(_mm256_slli_epi32(x, 16), 24));
      }
    }
  }
  for (int c = c0; c < cols; ++c) {
    const uint8_t* row = qs + (n0 + c) * q6row;
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* sb = row + s * kBytes;
      const float d = scale_d(sb);
      const int8_t* sc = (const int8_t*)(sb + 192);
      for (int b = 0; b < 8; ++b) {
        const int64_t at = (s * 8 + b) * kCols + c;
        p.dw[at] = d;
        p.slo[at] = sc[2 * b];
        p.shi[at] = sc[2 * b + 1];
      }
    }
  }
}
#endif

}  // namespace q6
}  // namespace pagedeck
