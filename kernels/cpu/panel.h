// The GEMM path's panel: up to kCols weight rows of any format unpacked into one layout that the register tiles
// (qgemm.h's, q4k.h's, q6.h's, iq4xs.h's) read, [block][4-byte step][column], and the transposes that build it. Each
// format's unpacker fills a Panel (affine.h: q4 and q5, q8.h, q6.h, q4k.h, the grouped formats' headers); q8g keeps
// its weights in this layout and hands the tiles a View of them.
#pragma once

#include "common.h"

#ifdef PD_AVX2
#include <cstring>
#include <type_traits>
#include <vector>

namespace pagedeck {
namespace gemm {

constexpr int kCols = 16;  // weight rows per panel: two vectors of 8 int32 lanes
constexpr int kRows = 4;   // activation rows per register tile

// One activation matrix, quantized as quantize_rows does without its q4 pair layout: q (M, K) int8 in natural
// order; per row and block (stride nbp): scale d, exact sum s, c = 8 d isum (q5 doubles it), integer sum isum.
// (The K-quants' tiles read activations per 256 instead: activations.h's ActK.)
struct Act {
  const int8_t* q;
  const float *d, *s, *c;
  const int32_t* isum;
  int64_t nb, nbp;
};

// A panel of up to kCols weight rows, unpacked: codes[(j * 8 + t) * kCols + col] holds weights 4t..4t+3 of
// block j (q4: codes 0..15; q5: 0..31; q8: stored u8 = q + 128), dw / zw[j * kCols + col] the block's fp32 scale
// and (q4) z = m + 8 d (q5: m + 16 d); columns past the panel's rows are zero. The K-quants' unpackers (q4k.h,
// q6.h) give the fields their own meanings, per super-block where the format's scale is.
// What the tiles read of a panel: an unpacked Panel's vectors, or weights kept in that layout (q8's row groups).
struct View {
  const int32_t* codes;
  const float *dw, *zw;
  const int32_t *slo, *shi;
  int32_t offset = 128;  // q8's codes' u8 = q + offset (128; qgemm.h's kCentred panels: 8)
};

struct Panel {
  std::vector<int32_t> codes;
  std::vector<float> dw, zw;
  std::vector<int32_t> slo, shi;
  std::vector<int32_t> mins;  // Q2_K's minimum pairs (q6.h's unpack_panel), read by its gemm_tile only
  int32_t offset = 128;  // only q4g's unpacker sets another (8), on every call: each format has its own Panel
  View view() const { return {codes.data(), dw.data(), zw.data(), slo.data(), shi.data(), offset}; }
};

// r[c] = the 8 code words (t = 0..7) of one block of column c; afterwards r[t] = word t of columns 0..7
inline void transpose8(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
  }
}

// The panel's 16 columns as one vector of int32 or fp32 lanes (Cols16 / Cols16f): one zmm with AVX-512, two
// ymm otherwise. A tile written once over these operations runs the same lane-wise instructions' arithmetic
// on either (every integer exact, every float op the same op on the same lane), so both builds give the same
// bits.
#ifdef PD_AVX512
struct Cols16 {
  __m512i v;
};
struct Cols16f {
  __m512 v;
};
inline Cols16 zero16() { return {_mm512_setzero_si512()}; }
inline Cols16 set16(int32_t v) { return {_mm512_set1_epi32(v)}; }
inline Cols16 load16(const int32_t* p) { return {_mm512_loadu_si512((const void*)p)}; }
inline Cols16 add16(Cols16 a, Cols16 b) { return {_mm512_add_epi32(a.v, b.v)}; }
inline Cols16 mullo16(Cols16 a, Cols16 b) { return {_mm512_mullo_epi32(a.v, b.v)}; }
// acc + the 4-byte dot products of u8 codes w (below 128) with the s8 word x broadcast (dpbusd)
inline Cols16 dot16(Cols16 acc, Cols16 w, int32_t x) { return {_mm512_dpbusd_epi32(acc.v, w.v, _mm512_set1_epi32(x))}; }
// acc + the 4-byte dot products of q8-form codes w (u8 q + 128) with the s8 word x broadcast: of u x with VNNI
// (the caller takes 128 sum(x) out, kVnni), of q x without (maddubs' pairs of u x would saturate)
inline Cols16 dot16_q8(Cols16 acc, Cols16 w, int32_t x) { return dot16(acc, w, x); }
// acc + the int16 pairs of w times the int16 pair x broadcast, summed pairwise (dpwssd)
inline Cols16 madd16(Cols16 acc, Cols16 w, int32_t x) { return {_mm512_dpwssd_epi32(acc.v, w.v, _mm512_set1_epi32(x))}; }
inline Cols16f zero16f() { return {_mm512_setzero_ps()}; }
inline Cols16f load16f(const float* p) { return {_mm512_loadu_ps(p)}; }
// acc + I * (d * dx), or acc - I * (d * dx) (Sub), one rounding of the product d dx and one of the fma
template <bool Sub>
inline Cols16f fma16(Cols16 I, Cols16f d, float dx, Cols16f acc) {
  const __m512 s = _mm512_mul_ps(d.v, _mm512_set1_ps(dx));
  const __m512 i = _mm512_cvtepi32_ps(I.v);
  return {Sub ? _mm512_fnmadd_ps(i, s, acc.v) : _mm512_fmadd_ps(i, s, acc.v)};
}
// out[0..cols) = the first `cols` lanes
inline void store16f(float* out, Cols16f v, int cols) { _mm512_mask_storeu_ps(out, (__mmask16)((1u << cols) - 1), v.v); }
#else
struct Cols16 {
  __m256i v[2];
};
struct Cols16f {
  __m256 v[2];
};
inline Cols16 zero16() { return {{_mm256_setzero_si256(), _mm256_setzero_si256()}}; }
inline Cols16 set16(int32_t v) { return {{_mm256_set1_epi32(v), _mm256_set1_epi32(v)}}; }
inline Cols16 load16(const int32_t* p) {
  return {{_mm256_loadu_si256((const __m256i*)p), _mm256_loadu_si256((const __m256i*)(p + 8))}};
}
inline Cols16 add16(Cols16 a, Cols16 b) { return {{_mm256_add_epi32(a.v[0], b.v[0]), _mm256_add_epi32(a.v[1], b.v[1])}}; }
inline Cols16 mullo16(Cols16 a, Cols16 b) {
  return {{_mm256_mullo_epi32(a.v[0], b.v[0]), _mm256_mullo_epi32(a.v[1], b.v[1])}};
}
inline Cols16 dot16(Cols16 acc, Cols16 w, int32_t x) {
  const __m256i b = _mm256_set1_epi32(x);
  return {{dot_u8s8(acc.v[0], w.v[0], b), dot_u8s8(acc.v[1], w.v[1], b)}};
}
inline Cols16 dot16_q8(Cols16 acc, Cols16 w, int32_t x) {
  if (kVnni) return dot16(acc, w, x);
  const __m256i b = _mm256_set1_epi32(x), flip = _mm256_set1_epi8((char)0x80);
  Cols16 out;
  for (int h = 0; h < 2; ++h) {
    const __m256i q = _mm256_xor_si256(w.v[h], flip);
    out.v[h] = dot_s8(acc.v[h], q, _mm256_sign_epi8(q, q), b);
  }
  return out;
}
inline Cols16 madd16(Cols16 acc, Cols16 w, int32_t x) {
  const __m256i b = _mm256_set1_epi32(x);
  return {{madd_acc(acc.v[0], w.v[0], b), madd_acc(acc.v[1], w.v[1], b)}};
}
inline Cols16f zero16f() { return {{_mm256_setzero_ps(), _mm256_setzero_ps()}}; }
inline Cols16f load16f(const float* p) { return {{_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}}; }
template <bool Sub>
inline Cols16f fma16(Cols16 I, Cols16f d, float dx, Cols16f acc) {
  const __m256 x = _mm256_set1_ps(dx);
  Cols16f out;
  for (int h = 0; h < 2; ++h) {
    const __m256 s = _mm256_mul_ps(d.v[h], x);
    const __m256 i = _mm256_cvtepi32_ps(I.v[h]);
    out.v[h] = Sub ? _mm256_fnmadd_ps(i, s, acc.v[h]) : _mm256_fmadd_ps(i, s, acc.v[h]);
  }
  return out;
}
inline void store16f(float* out, Cols16f v, int cols) {
  alignas(32) float res[kCols];
  _mm256_store_ps(res, v.v[0]);
  _mm256_store_ps(res + 8, v.v[1]);
  std::memcpy(out, res, cols * sizeof(float));
}
#endif

// Activation rows per tile of the integer-scale Cols16 tiles (q4k.h, q6.h, iq4xs.h): with 32 zmm, 8 rows'
// accumulators, integer sums and dot-product chains fit beside the weight vector, and each weight load serves 8
// dpbusd; with 16 ymm (two per Cols16) kRows. Q6_K and IQ4_XS matrices of Qwen2.5-1.5B's shapes at 1,056 rows ran
// 1.53-1.77x and 1.13-1.26x faster than with 4 (kernels.md, "Prompt rows of the K-quant mixes").
#ifdef PD_AVX512
constexpr int kRowsK = 8;
#else
constexpr int kRowsK = kRows;
#endif

// One sub-block of a K-quant tile (q4k.h, q6.h, iq4xs.h): I[r] += sc * (start(r) + T dot-product steps of the
// weight words at wp (kCols apart) with row r's activation words at xrow[r] + x0), dot: dot16 or dot16_q8
template <int R, int T, class Start, class Dot>
inline void sub_block(const int32_t* wp, const int8_t* const* xrow, int64_t x0, const int32_t* sc, Start&& start,
                      Dot&& dot, Cols16* I) {
  Cols16 sums[R];
  for (int r = 0; r < R; ++r) sums[r] = start(r);
  for (int t = 0; t < T; ++t) {
    const Cols16 w = load16(wp + t * kCols);
    for (int r = 0; r < R; ++r) {
      int32_t word;
      std::memcpy(&word, xrow[r] + x0 + 4 * t, 4);
      sums[r] = dot(sums[r], w, word);
    }
  }
  const Cols16 scale = load16(sc);
  for (int r = 0; r < R; ++r) I[r] = add16(I[r], mullo16(sums[r], scale));
}

// The K-quant minimums' step of super-block s for activation rows m0..m0+R (q4k.h's per 32, q6.h's Q2_K per 16):
// acc[r] -= J_r * (dm * dx), J_r = the exact sum over n int16-pair words pairs[i] (m_2i | m_2i+1 << 16 of each
// column) times the pair i of row m0 + r's 2 n activation sums of super-block s (sums: 2 n a super-block, nsb
// super-blocks a row; dx: one scale a super-block)
template <int R>
inline void minimum_step(const int32_t* pairs, int n, const int16_t* sums, const float* dx, int64_t nsb, int64_t m0,
                         int64_t s, const float* dm, Cols16f* acc) {
  Cols16 J[R];
  for (int r = 0; r < R; ++r) J[r] = zero16();
  for (int i = 0; i < n; ++i) {
    const Cols16 mw = load16(pairs + i * kCols);
    for (int r = 0; r < R; ++r) {
      int32_t word;
      std::memcpy(&word, sums + ((m0 + r) * nsb + s) * 2 * n + 2 * i, 4);
      J[r] = madd16(J[r], mw, word);
    }
  }
  const Cols16f d = load16f(dm);
  for (int r = 0; r < R; ++r) acc[r] = fma16<true>(J[r], d, dx[(m0 + r) * nsb + s], acc[r]);
}

// The K-quant tiles' frame (q4k.h, q6.h, iq4xs.h): out[r * ldo + col] for activation rows m0..m0+R (int8 codes q,
// K a row; scales dx per row and super-block, nsb a row) and the panel's first `cols` columns. Per super-block s
// in order: ints(s, xrow, I) builds each row's exact int32 I of the 16 columns (xrow[r]: row m0 + r's codes), then
// acc[r] = fma(I, d_s * dx, acc[r]) with d_s the panel's dw[s * kCols + col], then more(s, acc) (q4k's minimums).
template <int R, class Ints, class More>
inline void superblock_tile(const int8_t* q, const float* dx, const float* dw, int64_t K, int64_t nsb, int64_t m0,
                            float* out, int64_t ldo, int cols, Ints&& ints, More&& more) {
  Cols16f acc[R];
  const int8_t* xrow[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = zero16f();
    xrow[r] = q + (m0 + r) * K;
  }
  for (int64_t s = 0; s < nsb; ++s) {
    Cols16 I[R];
    for (int r = 0; r < R; ++r) I[r] = zero16();
    ints(s, xrow, I);
    const Cols16f d = load16f(dw + s * kCols);
    for (int r = 0; r < R; ++r) acc[r] = fma16<false>(I[r], d, dx[(m0 + r) * nsb + s], acc[r]);
    more(s, acc);
  }
  for (int r = 0; r < R; ++r) store16f(out + r * ldo, acc[r], cols);
}

// tile(std::integral_constant<int, R>, m) for rows m..m+R: M rows in tiles of kRowsK, the rest in one tile
template <int R, class Tile>
inline void rest_tile(int64_t m, int64_t left, Tile& tile) {
  if (left == R) return tile(std::integral_constant<int, R>{}, m);
  if constexpr (R > 1) rest_tile<R - 1>(m, left, tile);
}
template <class Tile>
inline void row_tiles(int64_t M, Tile&& tile) {
  int64_t m = 0;
  for (; m + kRowsK <= M; m += kRowsK) tile(std::integral_constant<int, kRowsK>{}, m);
  if (M > m) rest_tile<kRowsK - 1>(m, M - m, tile);
}

#ifdef PD_AVX512
// T[L] = [X[0] lane L, X[1] lane L, X[2] lane L, X[3] lane L] (128-bit lanes): a 4x4 transpose of lanes
inline void transpose_lanes(const __m512i X[4], __m512i T[4]) {
  const __m512i u0 = _mm512_shuffle_i64x2(X[0], X[1], 0x44), u1 = _mm512_shuffle_i64x2(X[2], X[3], 0x44);
  const __m512i v0 = _mm512_shuffle_i64x2(X[0], X[1], 0xEE), v1 = _mm512_shuffle_i64x2(X[2], X[3], 0xEE);
  T[0] = _mm512_shuffle_i64x2(u0, u1, 0x88);
  T[1] = _mm512_shuffle_i64x2(u0, u1, 0xDD);
  T[2] = _mm512_shuffle_i64x2(v0, v1, 0x88);
  T[3] = _mm512_shuffle_i64x2(v0, v1, 0xDD);
}

// T[t] = dword t of the 16 bytes at b + c * st, for the 16 columns c (lane c of each vector): four columns a
// vector (one per 128-bit lane), a dword transpose in each, then a transpose across lanes.
inline void words16(const uint8_t* b, int64_t st, __m512i T[4]) {
  const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  __m512i X[4];
  for (int g = 0; g < 4; ++g) {
    const uint8_t* p = b + 4 * g * st;
    __m512i A = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)p));
    A = _mm512_inserti32x4(A, _mm_loadu_si128((const __m128i*)(p + st)), 1);
    A = _mm512_inserti32x4(A, _mm_loadu_si128((const __m128i*)(p + 2 * st)), 2);
    A = _mm512_inserti32x4(A, _mm_loadu_si128((const __m128i*)(p + 3 * st)), 3);
    X[g] = _mm512_permutexvar_epi32(tr, A);
  }
  transpose_lanes(X, T);
}

// dw[(j + i) * kCols + c] = d of column c, block j + i, for 16 full columns and blocks j..j+15 (zw: fma(8, dw, m)
// as the scalar loop): 16 loads of 16 fp16 scales, a 16x16 transpose
inline void unpack_scales16(const uint16_t* d, const uint16_t* m, float centre, int64_t nb, int64_t n0, int64_t j,
                            float* dw, float* zw) {
  auto transposed = [&](const uint16_t* src, __m512 out[16]) {
    __m512 r[16];
    for (int c = 0; c < 16; ++c) r[c] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(src + (n0 + c) * nb + j)));
    __m512i B[4][4];  // B[q][e] lane L: rows 4q..4q+3 of column 4L + e
    for (int q = 0; q < 4; ++q) {
      const __m512 a0 = _mm512_unpacklo_ps(r[4 * q], r[4 * q + 1]), a1 = _mm512_unpackhi_ps(r[4 * q], r[4 * q + 1]);
      const __m512 a2 = _mm512_unpacklo_ps(r[4 * q + 2], r[4 * q + 3]),
                   a3 = _mm512_unpackhi_ps(r[4 * q + 2], r[4 * q + 3]);
      B[q][0] = _mm512_castpd_si512(_mm512_unpacklo_pd(_mm512_castps_pd(a0), _mm512_castps_pd(a2)));
      B[q][1] = _mm512_castpd_si512(_mm512_unpackhi_pd(_mm512_castps_pd(a0), _mm512_castps_pd(a2)));
      B[q][2] = _mm512_castpd_si512(_mm512_unpacklo_pd(_mm512_castps_pd(a1), _mm512_castps_pd(a3)));
      B[q][3] = _mm512_castpd_si512(_mm512_unpackhi_pd(_mm512_castps_pd(a1), _mm512_castps_pd(a3)));
    }
    for (int e = 0; e < 4; ++e) {
      const __m512i X[4] = {B[0][e], B[1][e], B[2][e], B[3][e]};
      __m512i T[4];
      transpose_lanes(X, T);
      for (int L = 0; L < 4; ++L) out[4 * L + e] = _mm512_castsi512_ps(T[L]);
    }
  };
  __m512 vd[16];
  transposed(d, vd);
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dw + (j + i) * kCols, vd[i]);
  if (!m) return;
  __m512 vm[16];
  transposed(m, vm);
  const __m512 c = _mm512_set1_ps(centre);
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(zw + (j + i) * kCols, _mm512_fmadd_ps(c, vd[i], vm[i]));
}
#endif

}  // namespace gemm
}  // namespace pagedeck
#endif
