// The instruction sets pagedeck's CPU kernels are compiled for, decided in one place, and the vector
// primitives the kernels share: the integer dot products (VNNI's dpbusd / dpwssd, or AVX2's maddubs + madd),
// fp16 conversion, horizontal sums and softmax's exp. A kernel header writes its algorithm over these and
// never tests a compiler macro itself; where a kernel has a wider form (the 512-bit tiles) it is chosen by
// PD_AVX512 next to the 256-bit one.
//
//   PD_AVX2    AVX2 + FMA + F16C: the vector kernels (without it the portable loops run; q8g needs it)
//   PD_VNNI    AVX512-VNNI on 256-bit registers: dpbusd / dpwssd instead of maddubs + madd
//   PD_AVX512  AVX512-F/BW + VNNI: the 512-bit tiles and panel unpackers
//   PD_AVX512_BYTES  AVX512-BW/VL byte masks on 256-bit registers (q5's fifth bits)
//   PD_AVX512_VBMI   PD_AVX512 + AVX512-VBMI: any-byte permutes (lut4's unpacking of 17- and 18-byte blocks)
// kernels/cpu_ext.py's PAGEDECK_CPU_ISA=avx2 compiles with -mno-avx512f -mno-avxvnni: PD_AVX2 alone.
// Every primitive gives the same integers (or floats) whichever form it compiles to, so every build has the
// same bits.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define PD_AVX2 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define PD_VNNI 1
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define PD_AVX512 1
#if defined(__AVX512VBMI__)
#define PD_AVX512_VBMI 1
#endif
#endif
#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define PD_AVX512_BYTES 1
#endif
#endif

namespace pagedeck {

inline float half_to_float(uint16_t h) {
#ifdef PD_AVX2
  return _cvtsh_ss(h);
#else
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal
      int e = -1;
      uint32_t m = man;
      do { ++e; m <<= 1; } while ((m & 0x400u) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

#ifdef PD_AVX2
#ifdef PD_VNNI
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// the sum of the 8 int32 lanes, exact
inline int32_t hsum_i32(__m256i v) {
  const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i h2 = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
  return _mm_cvtsi128_si32(_mm_add_epi32(h2, _mm_shuffle_epi32(h2, 0xb1)));
}

// exp(x) for x <= 0 (softmax), Cephes-style: 2^n * p(r), relative error ~1e-7; -inf and < -87 give 0.
inline __m256 exp_neg(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// 8 fp16 values from p on, as fp32
inline __m256 load_halfs(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }

// acc + the 4-byte dot products of u8 codes u (below 128: AVX2's maddubs would saturate its int16 pairs above)
// and s8 values x, exact in int32 (vpdpbusd with VNNI)
inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i x) {
#ifdef PD_VNNI
  return _mm256_dpbusd_epi32(acc, u, x);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
#endif
}

// acc + the 4-byte dot products of s8 codes q (their magnitudes aq = |q|) and s8 values x, on AVX2 without
// VNNI: maddubs takes |q| * sign(x, q) (at most 128 * 127 * 2 a pair, within int16), as llama.cpp does. With
// VNNI the q8 kernels multiply the stored u8 = q + 128 by dot_u8s8 and take 128 * sum(x) out instead
// (q8.h's dot, the + 128 fix in qgemm.h's tile).
inline __m256i dot_s8(__m256i acc, __m256i q, __m256i aq, __m256i x) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(x, q)), _mm256_set1_epi16(1)));
}

// acc + the int16 pairs of p times the int16 pairs of s, summed pairwise into int32 (vpdpwssd with VNNI)
inline __m256i madd_acc(__m256i acc, __m256i p, __m256i s) {
#ifdef PD_VNNI
  return _mm256_dpwssd_epi32(acc, p, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
#endif
}
#endif

}  // namespace pagedeck
