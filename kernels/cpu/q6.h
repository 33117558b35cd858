// The q6 format of qmatmul: GGUF Q6_K super-blocks kept as the file stores them (210 bytes a 256 weights: 128
// bytes of low nibbles, 64 of high 2-bit pairs, sixteen int8 scales, fp16 d), w = d * sc[i / 16] * (q - 32).
// Re-quantizing them to q8 (as pagedeck did) cost 8.5 bits a weight instead of 6.56, and batch-1 decode
// streams every weight once a token. The q3k format (GGUF Q3_K, 110 bytes: w = d * sc[i / 16] * (q - 4), codes
// 0..7, sixteen 6-bit scales less 32; kquant.h) has the same shape of arithmetic with an offset of 4, so these
// kernels read both, through a layout (Q6K, Q3K: its codes, scales, d and offset); 3.44 bits a weight where q8
// took 8.5. So does q2k (GGUF Q2_K, 84 bytes: w = d * sc[i / 16] * q - dmin * m[i / 16], codes 0..3, 4-bit sc
// and m), whose minimums take the offset's place: J = sum_h m_h hs_h, and q4k's step (kquant.h) ends each
// super-block: fma(I, d d_x, acc), then fma(-J, dmin d_x, acc). 2.63 bits a weight.
//
// The arithmetic is llama.cpp's Q6_K x Q8_K: activations quantized per 256 (activations.h's quantize_k: one fp32
// scale d_x a super-block, int8 codes x, and hs_h = the integer sum of the h-th 16 codes), the int8 scales applied
// as integers, the whole super-block one exact int32
//   I = sum_h sc_h (q_h . x_h - 32 hs_h)      (|I| <= 256 * 128 * 32 * 127 < 2^31; Q3_K's offset 4 for 32)
// and fp32 once a super-block: acc = fma(I, d d_x, acc), the result the last acc. Per-32 activation scales held
// the GEMM to a float epilogue (two conversions, two multiplies, an fma) every 32 weights and activation row,
// on the same ports as its dpbusd. The per-row path (tile), the 16-row groups (q6k16.h) and the GEMM path
// (gemm_tile, over panels from unpack_panel) build the same integers and run this one fp32 chain per output
// element, so their bits are the same for any batch, row order or thread count.
#pragma once

#include "activations.h"
#include "common.h"
#include "kquant.h"
#include "panel.h"

#include <type_traits>

namespace pagedeck {
namespace q6 {

// one super-block's step of an output element's chain
inline float step(float acc, int32_t I, float d, float dx) { return std::fma((float)I, d * dx, acc); }

// The two layouts these kernels read: the super-block's bytes, a code and a scale, d, the codes' offset as a
// power of two, and (AVX2) the codes of half n's four blocks of 32 and the sixteen scales as int8 lanes.
struct Q6K {
  static constexpr int64_t kBytes = q6::kBytes;
  static constexpr int kOffsetBits = 5;  // q - 32
  static constexpr bool kMins = false;
  static int code(const uint8_t* sb, int i) { return q6::code(sb, i); }
  static int8_t scale(const uint8_t* sb, int h) { return (int8_t)sb[192 + h]; }
  static float d(const uint8_t* sb) { return scale_d(sb); }
#ifdef PD_AVX2
  static void codes(const uint8_t* sb, int n, __m256i c[4]) { half_codes(sb, n, c); }
  static __m128i scales(const uint8_t* sb) { return _mm_loadu_si128((const __m128i*)(sb + 192)); }
#endif
};
struct Q3K {
  static constexpr int64_t kBytes = q3k::kBytes;
  static constexpr int kOffsetBits = 2;  // q - 4
  static constexpr bool kMins = false;
  static int code(const uint8_t* sb, int i) { return q3k::code(sb, i); }
  static int8_t scale(const uint8_t* sb, int h) { return q3k::scale(sb, h); }
  static float d(const uint8_t* sb) { return q3k::scale_d(sb); }
#ifdef PD_AVX2
  static void codes(const uint8_t* sb, int n, __m256i c[4]) { q3k::half_codes(sb, n, c); }
  static __m128i scales(const uint8_t* sb) { return q3k::scales16(sb); }
#endif
};
struct Q2K {  // no offset: sixteen 4-bit minimums m_h and dmin (kMins)
  static constexpr int64_t kBytes = q2k::kBytes;
  static constexpr int kOffsetBits = 0;
  static constexpr bool kMins = true;
  static int code(const uint8_t* sb, int i) { return q2k::pair(sb + q2k::kQs, i); }
  static int8_t scale(const uint8_t* sb, int h) { return (int8_t)(sb[q2k::kScales + h] & 15); }
  static int8_t min(const uint8_t* sb, int h) { return (int8_t)(sb[q2k::kScales + h] >> 4); }
  static float d(const uint8_t* sb) { return q4k::half_at(sb + q2k::kD); }
  static float dmin(const uint8_t* sb) { return q4k::half_at(sb + q2k::kDmin); }
#ifdef PD_AVX2
  static void codes(const uint8_t* sb, int n, __m256i c[4]) { q2k::half_pairs(sb + q2k::kQs, n, c); }
  static __m128i scales(const uint8_t* sb) {
    return _mm_and_si128(_mm_loadu_si128((const __m128i*)(sb + q2k::kScales)), _mm_set1_epi8(15));
  }
  static __m128i mins(const uint8_t* sb) {
    return _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i*)(sb + q2k::kScales)), 4), _mm_set1_epi8(15));
  }
#endif
};

#ifdef PD_AVX2
// out[r] = weight row `row` . activation rows m0..m0+MT: per super-block the codes meet each row's activations
// 32 at a time (maddubs: int16 pairs of at most 2 * 63 * 127; madd with the block's two scales as int16 adds
// sc times them into int32 lanes), the offset (32, Q3_K's 4) from the scales against hs (one madd), then step.
template <class L, int MT>
inline void tile(const uint8_t* row, int64_t nsb, const ActK& a, int64_t K, int64_t m0, float* out) {
  float acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = 0.0f;
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = row + s * L::kBytes;
    for (int b = 0; b < L::kBytes; b += 64) _mm_prefetch((const char*)sb + kPrefetch + b, _MM_HINT_T0);
    const __m128i sc8 = L::scales(sb);
    __m256i isum[MT];
    for (int r = 0; r < MT; ++r) isum[r] = _mm256_setzero_si256();
    for (int n = 0; n < 2; ++n) {
      __m256i c[4];
      L::codes(sb, n, c);
      for (int k = 0; k < 4; ++k) {
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, scale_shuffle(4 * n + k)));
        for (int r = 0; r < MT; ++r) {
          const int8_t* x = a.q.data() + (m0 + r) * K + s * kSuper + 128 * n + 32 * k;
          const __m256i v = _mm256_maddubs_epi16(c[k], _mm256_loadu_si256((const __m256i*)x));
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(v, sc));
        }
      }
    }
    // against hs: the scales (the offset's correction), or Q2_K's minimums (J)
    __m256i w16;
    if constexpr (L::kMins) w16 = _mm256_cvtepi8_epi16(L::mins(sb));
    else w16 = _mm256_cvtepi8_epi16(sc8);
    const float d = L::d(sb);
    for (int r = 0; r < MT; ++r) {
      const int64_t at = (m0 + r) * nsb + s;
      const __m256i corr = _mm256_madd_epi16(w16, _mm256_loadu_si256((const __m256i*)(a.hs.data() + 16 * at)));
      if constexpr (L::kMins)
        acc[r] = q4k::step(acc[r], hsum_i32(isum[r]), hsum_i32(corr), d, L::dmin(sb), a.d[at]);
      else
        acc[r] = step(acc[r], hsum_i32(_mm256_sub_epi32(isum[r], _mm256_slli_epi32(corr, L::kOffsetBits))), d, a.d[at]);
    }
  }
  for (int r = 0; r < MT; ++r) out[r] = acc[r];
}
#else  // portable: the same integers and chain, one code at a time
template <class L, int MT>
inline void tile(const uint8_t* row, int64_t nsb, const ActK& a, int64_t K, int64_t m0, float* out) {
  for (int r = 0; r < MT; ++r) {
    float acc = 0.0f;
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* sb = row + s * L::kBytes;
      const int64_t at = (m0 + r) * nsb + s;
      const int8_t* x = a.q.data() + (m0 + r) * K + s * kSuper;
      int32_t I = 0, J = 0;
      for (int h = 0; h < 16; ++h) {
        int32_t dot = 0;
        for (int i = 16 * h; i < 16 * h + 16; ++i) dot += L::code(sb, i) * x[i];
        if constexpr (L::kMins) {
          I += L::scale(sb, h) * dot;
          J += L::min(sb, h) * a.hs[16 * at + h];
        } else {
          I += L::scale(sb, h) * (dot - (1 << L::kOffsetBits) * a.hs[16 * at + h]);
        }
      }
      if constexpr (L::kMins) acc = q4k::step(acc, I, J, L::d(sb), L::dmin(sb), a.d[at]);
      else acc = step(acc, I, L::d(sb), a.d[at]);
    }
    out[r] = acc;
  }
}
#endif

// out[m] = weight row n . activation row m, 4 activation rows sharing each unpacked super-block
template <class L = Q6K>
inline void weight_row(const uint8_t* qs, int64_t K, const ActK& a, int64_t M, int64_t n, float* out) {
  const int64_t nsb = K / kSuper;
  const uint8_t* row = qs + n * nsb * L::kBytes;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile<L, 4>(row, nsb, a, K, m, out + m);
  for (; m < M; ++m) tile<L, 1>(row, nsb, a, K, m, out + m);
}

#ifdef PD_AVX2
// The GEMM path's panel of rows n0..n0+cols (panel.h's Panel, q6's meaning of its fields): codes[(j * 8 + t) *
// kCols + col] = codes 4t..4t+3 (0..63) of 32-weight block j, slo / shi[j * kCols + col] = the int8 scales of
// its two halves of 16, dw[s * kCols + col] = super-block s's d; columns past `cols` are zero. One pass over
// each super-block of a column (its 192 code bytes read once, as tile reads them), the 8 blocks of 8 columns
// transposed together. (Q3_K: codes 0..7, its scales decoded a column at a time.)
template <class L = Q6K>
inline void unpack_panel(const uint8_t* qs, int64_t nb, int64_t n0, int cols, gemm::Panel& p) {
  using gemm::kCols;
  const int64_t nsb = nb / 8, q6row = nsb * L::kBytes;
  p.codes.resize(nb * 8 * kCols);
  p.dw.assign(nsb * kCols, 0.0f);
  if constexpr (L::kMins) {  // Q2_K: dmin and the minimums' pairs m_2i | m_2i+1 << 16
    p.zw.assign(nsb * kCols, 0.0f);
    p.mins.assign(nb * kCols, 0);
  } else {
    p.zw.clear();
  }
  p.slo.assign(nb * kCols, 0);
  p.shi.assign(nb * kCols, 0);
  for (int g = 0; g < kCols; g += 8) {
    for (int64_t s = 0; s < nsb; ++s) {
      __m256i blk[8][8];  // [block of the super-block][column]
      for (int c = 0; c < 8; ++c) {
        if (g + c >= cols) {
          for (int b = 0; b < 8; ++b) blk[b][c] = _mm256_setzero_si256();
          continue;
        }
        const uint8_t* sb = qs + (n0 + g + c) * q6row + s * L::kBytes;
        for (int n = 0; n < 2; ++n) {
          __m256i c4[4];
          L::codes(sb, n, c4);
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
  int c0 = 0;  // Q6_K's full groups of 8 columns: the scales' bytes gathered one dword (sc[2b], sc[2b + 1], ...) a column
  for (; std::is_same_v<L, Q6K> && c0 + 8 <= cols; c0 += 8) {
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)q6row));
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* base = qs + (n0 + c0) * q6row + s * kBytes;
      // bytes 206..209: sc[14], sc[15] and d (never read past the super-block)
      const __m256i top = _mm256_i32gather_epi32((const int*)(base + 206), idx, 1);
      const __m256i dh = _mm256_srli_epi32(top, 16);
      _mm256_storeu_ps(p.dw.data() + s * kCols + c0,
                       _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(dh), _mm256_extracti128_si256(dh, 1))));
      for (int b = 0; b < 8; ++b) {
        const __m256i x = b == 7 ? top : _mm256_i32gather_epi32((const int*)(base + 192 + 2 * b), idx, 1);
        const int64_t at = (s * 8 + b) * kCols + c0;
        _mm256_storeu_si256((__m256i*)(p.slo.data() + at), _mm256_srai_epi32(_mm256_slli_epi32(x, 24), 24));
        _mm256_storeu_si256((__m256i*)(p.shi.data() + at), _mm256_srai_epi32(_mm256_slli_epi32(x, 16), 24));
      }
    }
  }
  for (int c = c0; c < cols; ++c) {
    const uint8_t* row = qs + (n0 + c) * q6row;
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* sb = row + s * L::kBytes;
      p.dw[s * kCols + c] = L::d(sb);
      for (int b = 0; b < 8; ++b) {
        p.slo[(s * 8 + b) * kCols + c] = L::scale(sb, 2 * b);
        p.shi[(s * 8 + b) * kCols + c] = L::scale(sb, 2 * b + 1);
      }
      if constexpr (L::kMins) {
        p.zw[s * kCols + c] = L::dmin(sb);
        for (int b = 0; b < 8; ++b)
          p.mins[(s * 8 + b) * kCols + c] = L::min(sb, 2 * b) | (int32_t)L::min(sb, 2 * b + 1) << 16;
      }
    }
  }
}

// out[r * ldo + col] for activation rows m0..m0+R and the panel's first `cols` columns, all 16 columns a vector
// (panel.h's Cols16): per half of 16 weights 4 dot-product steps from -32 hs (so the half ends at q_h . x_h -
// 32 hs_h; Q3_K's 4; Q2_K's from 0), then I += sc_h times it (vpmulld); per super-block step's fp32 chain,
// lane-wise, and Q2_K's minimums after it (J from eight int16-pair multiply-adds of m against hs, as q4k.h's).
template <class L, int R>
inline void gemm_tile(const gemm::Panel& p, const ActK& a, int64_t K, int64_t m0, float* out, int64_t ldo, int cols) {
  using gemm::kCols;
  const int64_t nsb = a.nsb;
  auto ints = [&](int64_t s, const int8_t* const* xrow, gemm::Cols16* I) {
    for (int h = 0; h < 16; ++h) {  // half h of the super-block: steps 4 (h % 2)..+4 of block 8 s + h / 2
      const int64_t j = 8 * s + h / 2;
      const int32_t* sc = (h % 2 ? p.shi : p.slo).data() + j * kCols;
      gemm::sub_block<R, 4>(
          p.codes.data() + (j * 8 + 4 * (h % 2)) * kCols, xrow, 16 * (16 * s + h), sc,
          [&](int r) {
            return L::kMins ? gemm::zero16()
                            : gemm::set16(-(1 << L::kOffsetBits) * (int32_t)a.hs[((m0 + r) * nsb + s) * 16 + h]);
          },
          [](gemm::Cols16 acc, gemm::Cols16 w, int32_t x) { return gemm::dot16(acc, w, x); }, I);
    }
  };
  auto minimums = [&](int64_t s, gemm::Cols16f* acc) {  // Q2_K: acc -= J * (dmin * dx), J = sum_h m_h hs_h
    if constexpr (L::kMins)
      gemm::minimum_step<R>(p.mins.data() + 8 * s * kCols, 8, a.hs.data(), a.d.data(), nsb, m0, s,
                            p.zw.data() + s * kCols, acc);
  };
  gemm::superblock_tile<R>(a.q.data(), a.d.data(), p.dw.data(), K, nsb, m0, out, ldo, cols, ints, minimums);
}
#endif

}  // namespace q6
}  // namespace pagedeck
