// The int8 multiply-add peak of one core, for the roofline of the prompt-rows GEMM (kernels/cpu/qgemm.h) and
// whether its float epilogue competes with the integer dot products for the same vector pipes:
//   g++ -O2 -march=native -o /tmp/int8_peak tools/bench/int8_peak.cpp && /tmp/int8_peak
// (AVX-512 VNNI machines only.) Twelve independent accumulator chains, so neither latency nor loads limit:
// 256-bit and 512-bit vpdpbusd alone, fp32 fmas alone, and twelve vpdpbusd mixed with six fmas a round.
#include <immintrin.h>

#include <chrono>
#include <cstdio>

#define R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define R6(X) X(0) X(1) X(2) X(3) X(4) X(5)

template <int MODE>
double seconds(long iters, volatile int* sink) {
#define DA(i) __m256i a##i = _mm256_set1_epi32(i); __m512i z##i = _mm512_set1_epi32(i);
  R12(DA)
#define DF(i) __m256 f##i = _mm256_set1_ps(i);
  R6(DF)
  __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(5);
  __m512i wz = _mm512_set1_epi8(3), xz = _mm512_set1_epi8(5);
  __m256 fm = _mm256_set1_ps(1.0001f);
  asm volatile("" : "+x"(w), "+x"(x), "+v"(wz), "+v"(xz), "+x"(fm));  // opaque operands: nothing folds
  const auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < iters; ++it) {
#define Y(i) a##i = _mm256_dpbusd_epi32(a##i, w, x);
#define Z(i) z##i = _mm512_dpbusd_epi32(z##i, wz, xz);
#define F(i) f##i = _mm256_fmadd_ps(f##i, fm, fm);
    if (MODE == 0) { R12(Y) }
    if (MODE == 1) { R12(Z) }
    if (MODE == 2) { R12(Y) R6(F) }
    if (MODE == 3) { R6(F) R6(F) }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#define S(i) *sink += _mm256_extract_epi32(a##i, 0) + _mm512_reduce_add_epi32(z##i);
  R12(S)
#define SF(i) *sink += (int)f##i[0];
  R6(SF)
  return s;
}

int main() {
  const long n = 100000000;
  volatile int sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const double y = seconds<0>(n, &sink), z = seconds<1>(n / 2, &sink), mix = seconds<2>(n, &sink),
                 f = seconds<3>(n, &sink);
    std::printf("vpdpbusd ymm %.1f GMAC/s (%.2f G/s) | zmm %.1f GMAC/s (%.2f G/s) | fma ymm alone %.2f G/s | "
                "12 ymm vpdpbusd + 6 fma: %.2f G vpdpbusd/s + %.2f G fma/s\n",
                n * 12. * 32 / y / 1e9, n * 12. / y / 1e9, n / 2 * 12. * 64 / z / 1e9, n / 2 * 12. / z / 1e9,
                n * 12. / f / 1e9, n * 12. / mix / 1e9, n * 6. / mix / 1e9);
  }
}
