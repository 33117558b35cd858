// The q4k format of qmatmul: GGUF Q4_K super-blocks kept as the file stores them (144 bytes a 256 weights:
// fp16 d and dmin, 12 bytes of 6-bit scales sc and minimums m per 32, 128 bytes of nibbles, the low nibbles of
// bytes 32c..32c+31 being sub-block 2c and the high ones sub-block 2c+1), w = d sc q - dmin m. Repacking them
// into q4 (fp16 scale and minimum per 32: 5 bits a weight, Q4_K's own 4.5) made every decode step read ~7 %
// more bytes and rounded d * sc and dmin * m to fp16; here they are exact fp32 products.
//
// The arithmetic is q4's (qmatmul.cpp's dot_tile), centred: per sub-block b, with dw = d * sc_b and
// z = 8 dw - dmin m_b (w = dw (q - 8) + z), acc (lane b) = fma(S_b, dw * d_x, acc), mins = fma(z, s_x, mins)
// then fnmadd(dw, c_x, mins), result hsum(acc) + hsum(mins), S_b the exact integer sum of q x, s_x the exact
// fp32 block sum of x and c_x = 8 d_x isum_x (quantize_rows). A super-block is one group of 8 blocks, so the
// GEMM path (qgemm.h's q4 tile, fed by unpack_panel below) repeats the sequence bit for bit.
#pragma once

#include "common.h"
#include "qgemm.h"

namespace pagedeck {
namespace q4k {

constexpr int64_t kSuper = 256, kBytes = 144;

// the eight 6-bit scales (out[0..7]) and minimums (out[8..15]) of a super-block (ggml's get_scale_min_k4)
inline void scale_mins(const uint8_t* sb, uint8_t out[16]) {
  const uint8_t* q = sb + 4;
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      out[j] = q[j] & 63;
      out[8 + j] = q[j + 4] & 63;
    } else {
      out[j] = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
      out[8 + j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
  }
}

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

// code (0..15) of weight i of one super-block
inline int code(const uint8_t* sb, int i) {
  const int b = i / 32, t = i % 32;
  const uint8_t v = sb[16 + 32 * (b / 2) + t];
  return (b & 1) ? (v >> 4) : (v & 0x0F);
}

#ifdef PD_AVX2
// dw = d * sc and z = 8 dw - dmin m of the super-block's 8 sub-blocks, in lanes 0..7. The 6-bit fields are
// regrouped in four 32-bit words (ggml's kmask trick: sc0..7 then m0..7) and enter a vector without a store
// (16 byte stores read back as one vector stalled store forwarding on every super-block).
inline void affine(const uint8_t* sb, __m256& dw, __m256& z) {
  constexpr uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
  uint32_t u[3];
  std::memcpy(u, sb + 4, 12);
  const uint32_t m47 = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
  const uint32_t m03 = u[1] & k1;
  const uint32_t s47 = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
  const __m128i v = _mm_set_epi32((int)m47, (int)m03, (int)s47, (int)(u[0] & k1));
  const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
  const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
  dw = _mm256_mul_ps(_mm256_set1_ps(half_at(sb)), sc);
  const __m256 dm = _mm256_mul_ps(_mm256_set1_ps(half_at(sb + 2)), mn);
  z = _mm256_fmsub_ps(_mm256_set1_ps(8.0f), dw, dm);
}

inline __m256i dot_u8s8(__m256i u, __m256i s) {  // codes below 16: no int16 saturation
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// out[r] = weight row . activation rows m0..m0+MT (xq: int8 (M, K) in quantize_rows' pair layout, each pair
// of blocks (j, j+1) as [x_j[0:16], x_j+1[0:16], x_j[16:32], x_j+1[16:32]]; dx, sx, cx: per block, stride nbp).
// Bytes 0..15 of a 32-byte nibble chunk hold weights 0..15 of both its blocks (low nibbles block j, high
// j+1): one 128-bit broadcast load shifted by 0 | 4 per half meets the pair's first 32 activation bytes, no
// cross-lane shuffle, and each pair's dot product lands as q4's does (lanes 0-3 block j, 4-7 block j+1), so
// 8 blocks reduce in 3 hadds as in dot_tile.
template <int MT>
inline void tile(const uint8_t* row, int64_t nsb, const int8_t* xq, const float* dx, const float* sx,
                 const float* cx, int64_t K, int64_t nbp, int64_t m0, float* out) {
  __m256 acc[MT], mins[MT];
  for (int r = 0; r < MT; ++r) acc[r] = mins[r] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), shift = _mm256_setr_epi64x(0, 0, 4, 4);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = row + s * kBytes;
    _mm_prefetch((const char*)(sb + 2048), _MM_HINT_T0);
    __m256i q[MT][4];
    for (int c = 0; c < 4; ++c) {
      const __m128i* p = (const __m128i*)(sb + 16 + 32 * c);
      const __m256i a = _mm256_and_si256(_mm256_srlv_epi64(_mm256_broadcastsi128_si256(_mm_loadu_si128(p)), shift), m4);
      const __m256i b = _mm256_and_si256(_mm256_srlv_epi64(_mm256_broadcastsi128_si256(_mm_loadu_si128(p + 1)), shift), m4);
      for (int r = 0; r < MT; ++r) {
        const int8_t* x = xq + (m0 + r) * K + s * kSuper + 64 * c;
        q[r][c] = _mm256_add_epi32(dot_u8s8(a, _mm256_loadu_si256((const __m256i*)x)),
                                   dot_u8s8(b, _mm256_loadu_si256((const __m256i*)(x + 32))));
      }
    }
    __m256 dw, z;
    affine(sb, dw, z);
    for (int r = 0; r < MT; ++r) {
      // [b0 b2 b4 b6 | b1 b3 b5 b7], then block order
      const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(q[r][0], q[r][1]), _mm256_hadd_epi32(q[r][2], q[r][3]));
      const __m256i sums = _mm256_permutevar8x32_epi32(h, order);
      const int64_t at = (m0 + r) * nbp + s * 8;
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(dw, _mm256_loadu_ps(dx + at)), acc[r]);
      mins[r] = _mm256_fmadd_ps(z, _mm256_loadu_ps(sx + at), mins[r]);
      mins[r] = _mm256_fnmadd_ps(dw, _mm256_loadu_ps(cx + at), mins[r]);
    }
  }
  for (int r = 0; r < MT; ++r) out[r] = hsum(acc[r]) + hsum(mins[r]);
}

// The GEMM path's panel (qgemm.h's q4 layout) of rows n0..n0+cols of a q4k matrix: codes 0..15 of block j
// at [j][4-byte step][column], dw and z per block and column (the per-row path's fp32 values).
inline void unpack_panel(const uint8_t* qs, int64_t nb, int64_t n0, int cols, gemm::Panel& p) {
  using gemm::kCols;
  const int64_t row_bytes = nb / 8 * kBytes;
  p.codes.resize(nb * 8 * kCols);
  p.dw.assign(nb * kCols, 0.0f);
  p.zw.assign(nb * kCols, 0.0f);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int g = 0; g < kCols; g += 8) {
    for (int64_t j = 0; j < nb; ++j) {
      __m256i r[8];
      for (int c = 0; c < 8; ++c) {
        if (g + c >= cols) {
          r[c] = _mm256_setzero_si256();
          continue;
        }
        const uint8_t* sb = qs + (n0 + g + c) * row_bytes + j / 8 * kBytes;
        const __m256i v = _mm256_loadu_si256((const __m256i*)(sb + 16 + 32 * ((j % 8) / 2)));
        r[c] = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(j & 1 ? 4 : 0)), m4);
      }
      gemm::transpose8(r);
      int32_t* dst = p.codes.data() + j * 8 * kCols + g;
      for (int t = 0; t < 8; ++t) _mm256_storeu_si256((__m256i*)(dst + t * kCols), r[t]);
    }
  }
  alignas(32) float dw[8], z[8];
  for (int c = 0; c < cols; ++c) {
    const uint8_t* row = qs + (n0 + c) * row_bytes;
    for (int64_t s = 0; s < nb / 8; ++s) {
      __m256 vd, vz;
      affine(row + s * kBytes, vd, vz);
      _mm256_store_ps(dw, vd);
      _mm256_store_ps(z, vz);
      for (int b = 0; b < 8; ++b) {
        p.dw[(8 * s + b) * kCols + c] = dw[b];
        p.zw[(8 * s + b) * kCols + c] = z[b];
      }
    }
  }
}
#else
template <int MT>
inline void tile(const uint8_t* row, int64_t nsb, const int8_t* xq, const float* dx, const float* sx,
                 const float* cx, int64_t K, int64_t nbp, int64_t m0, float* out) {
  for (int r = 0; r < MT; ++r) {
    float acc = 0.0f, mins = 0.0f;
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* sb = row + s * kBytes;
      uint8_t sm[16];
      scale_mins(sb, sm);
      const float d = half_at(sb), dmin = half_at(sb + 2);
      for (int b = 0; b < 8; ++b) {
        int32_t sum = 0;
        for (int i = 0; i < 32; ++i) sum += code(sb, 32 * b + i) * xq[(m0 + r) * K + s * kSuper + 32 * b + i];
        const int64_t at = (m0 + r) * nbp + s * 8 + b;
        const float dw = d * (float)sm[b], z = std::fma(8.0f, dw, -(dmin * (float)sm[8 + b]));
        acc += (float)sum * (dw * dx[at]);
        mins += z * sx[at] - dw * cx[at];
      }
    }
    out[r] = acc + mins;
  }
}
#endif

// out[m] = weight row n . activation row m, 4 activation rows sharing each unpacked super-block
inline void weight_row(const uint8_t* qs, int64_t K, const int8_t* xq, const float* dx, const float* sx,
                       const float* cx, int64_t nbp, int64_t M, int64_t n, float* out) {
  const int64_t nsb = K / kSuper;
  const uint8_t* row = qs + n * nsb * kBytes;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile<4>(row, nsb, xq, dx, sx, cx, K, nbp, m, out + m);
  for (; m < M; ++m) tile<1>(row, nsb, xq, dx, sx, cx, K, nbp, m, out + m);
}

}  // namespace q4k
}  // namespace pagedeck
