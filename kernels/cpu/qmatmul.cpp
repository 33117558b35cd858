// Packed-weight matmuls for decode-sized row counts: y = x @ W^T with W in 32-weight blocks.
//
// Formats (one kernel per format, one entry point):
//   q4: w = d * q + m, q in 0..15 (16 bytes of nibbles a block: low nibbles are weights 0..15, high 16..31,
//       GGUF's Q4_0/Q4_1 order), d and m fp16 per block.
//   q8: w = d * q, q int8 (GGUF's Q8_0) stored as u8 q + 128, d fp16 per block.
//   q6: GGUF Q6_K super-blocks as the file stores them (q6.h), no separate scales.
//   q4k: GGUF Q4_K super-blocks as the file stores them (q4k.h), no separate scales.
//   q4k16: the same super-blocks with rows regrouped 16 at a time (q4k16.h; qs is (N / 16, K / 256 * 2304)),
//       the same bits as q4k without its per-row horizontal reductions.
//   q5: w = d * q + m, q in 0..31 (GGUF Q5_0/Q5_1), q4's scales plus a fifth bit plane beside the nibbles
//       (q5.h; qs is (N, K / 32 * 20)), computed as q4 centred at 16.
//   q8g: q8 with rows regrouped 16 at a time in the GEMM panel's layout (q8g.h; qs (N / 16, K / 32 * 512), d
//       (N / 16, K / 32 * 16)): every row count takes the GEMM tiles, with nothing to unpack; q8's bits.
// Activations are quantized per row and block to int8 (d_x = max|x| / 127) and multiplied with integer dot
// products (AVX2 maddubs, or AVX512-VNNI dpbusd where the compiler may use it), as llama.cpp does. q4 is
// computed centred, w = d (q - 8) + z with z = m + 8d, and z multiplies the exact fp32 block sum of x: the
// activation rounding error then meets only d (q - 8), not the block offset (Q4_1 blocks often have |m| ~ 8d,
// and charging the error to d q + m instead was 5x worse on the default model). Every output element is
// computed by the same sequence of operations whatever the number of rows or threads, so results never
// depend on the batch.
#include "common.h"
#include "ops.h"
#include "q4k.h"
#include "q4k16.h"
#include "q5.h"
#include "q6.h"
#include "q8g.h"
#include "qgemm.h"

#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <limits>
#include <vector>

namespace pagedeck {
namespace {

enum Act : int64_t { kNone = 0, kSwiGLU = 1 };
constexpr int64_t kScalePad = 8;  // fp16 values after a scale tensor's end (see load_halfs)
constexpr int64_t kGroupRows = 16;  // rows a group of q4k16 and q8g
static_assert(kGroupRows == q4k16::kRows && kGroupRows == q8g::kRows,
              "the grouped formats share their SwiGLU rule");

// q (M, K) int8; per block, rows padded with zeros to nbp = a multiple of 8 blocks (M, nbp): scale d,
// exact sum s, c = 8 d sum(q), isum = sum(q); per 16 (M, 2 nbp), for q6 only: xs16 = sum(q)
struct QuantAct {
  std::vector<int8_t> q;
  std::vector<float> d, s, c;
  std::vector<int32_t> isum;
  std::vector<int16_t> xs16;
  int64_t nbp = 0;
  q4k::ActK k;  // q4k's activations (per 256, q4k.h's quantize_k) instead of the per-32 ones
};

QuantAct& scratch() {
  thread_local QuantAct a;
  return a;
}

// pairs: q4's layout, each pair of blocks (j, j+1) stored as [x_j[0:16], x_j+1[0:16], x_j[16:32], x_j+1[16:32]]
// so that one 32-byte load of the two blocks' nibbles meets its activations without a cross-lane shuffle
// (an odd last block stays as it is).
void quantize_rows(const float* x, int64_t M, int64_t K, QuantAct& a, bool pairs, bool sums16) {
  const int64_t nb = K / kBlock, nbp = (nb + 7) / 8 * 8;
  a.nbp = nbp;
  a.q.resize(M * K);
  a.d.assign(M * nbp, 0.0f);
  a.s.assign(M * nbp, 0.0f);
  a.c.assign(M * nbp, 0.0f);
  a.isum.assign(M * nbp, 0);
  a.xs16.assign(sums16 ? M * nbp * 2 : 0, 0);
  for (int64_t blk = 0; blk < M * nb; ++blk) {
    const int64_t r = blk / nb * nbp + blk % nb;
    const float* v = x + blk * kBlock;
    int8_t* q = a.q.data() + blk * kBlock;
#ifdef PD_AVX2
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 x0 = _mm256_loadu_ps(v), x1 = _mm256_loadu_ps(v + 8), x2 = _mm256_loadu_ps(v + 16),
           x3 = _mm256_loadu_ps(v + 24);
    __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, x0), _mm256_andnot_ps(sign, x1)),
                              _mm256_max_ps(_mm256_andnot_ps(sign, x2), _mm256_andnot_ps(sign, x3)));
    const float amax = hmax(mx);
    a.s[r] = hsum(_mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3)));
    const float d = amax / 127.0f;
    a.d[r] = d;
    const __m256 inv = _mm256_set1_ps(d > 0.0f ? 127.0f / amax : 0.0f);
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(x0, inv)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(x1, inv)),
            i2 = _mm256_cvtps_epi32(_mm256_mul_ps(x2, inv)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(x3, inv));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // undo lane interleave
    _mm256_storeu_si256((__m256i*)q, p);
    const __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), p);
    const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    const __m128i h2 = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    a.isum[r] = _mm_cvtsi128_si32(_mm_add_epi32(h2, _mm_shuffle_epi32(h2, 0xb1)));
    if (sums16) {  // [lo, hi, lo, hi]: the sums of weights 0..15 and 16..31
      __m128i t = _mm_hadd_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
      t = _mm_hadd_epi32(t, t);
      a.xs16[2 * r] = (int16_t)_mm_cvtsi128_si32(t);
      a.xs16[2 * r + 1] = (int16_t)_mm_extract_epi32(t, 1);
    }
    a.c[r] = 8.0f * d * (float)a.isum[r];
#else
    float amax = 0.0f, sum = 0.0f;
    for (int i = 0; i < kBlock; ++i) {
      amax = std::max(amax, std::fabs(v[i]));
      sum += v[i];
    }
    const float d = amax / 127.0f, inv = d > 0.0f ? 127.0f / amax : 0.0f;
    a.d[r] = d;
    a.s[r] = sum;
    int32_t isum = 0;
    for (int i = 0; i < kBlock; ++i) {
      q[i] = (int8_t)std::nearbyint(v[i] * inv);
      isum += q[i];
    }
    a.isum[r] = isum;
    a.c[r] = 8.0f * d * (float)isum;
    if (sums16) {
      int32_t lo = 0;
      for (int i = 0; i < 16; ++i) lo += q[i];
      a.xs16[2 * r] = (int16_t)lo;
      a.xs16[2 * r + 1] = (int16_t)(isum - lo);
    }
#endif
  }
#ifdef PD_AVX2
  if (!pairs) return;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t j = 0; j + 1 < nb; j += 2) {
      __m256i* p = (__m256i*)(a.q.data() + (m * nb + j) * kBlock);
      const __m256i b0 = _mm256_loadu_si256(p), b1 = _mm256_loadu_si256(p + 1);
      _mm256_storeu_si256(p, _mm256_permute2x128_si256(b0, b1, 0x20));
      _mm256_storeu_si256(p + 1, _mm256_permute2x128_si256(b0, b1, 0x31));
    }
  }
#else
  (void)pairs;
#endif
}

// gemm:: shares kQ8, kQ4, kQ6 and kQ5
enum Format { kQ8 = 0, kQ4 = 1, kQ6 = 2, kQ4K = 3, kQ4K16 = 4, kQ5 = 5, kQ8G = 6 };

struct Weights {
  const uint8_t* qs;
  const uint16_t* d;  // q4, q5, q8 and q8g
  const uint16_t* m;  // q4 and q5
  int64_t K, nb;
};

// the nibble formats: codes below 16 (q4) or 32 (q5), a minimum per block, products centred (see the top)
constexpr bool nibbled(int F) { return F == kQ4 || F == kQ5; }
constexpr float centre(int F) { return q5::centre(F == kQ5); }

#ifdef PD_AVX2
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define PD_VNNI 1
#endif

inline __m256i dot_u8s8(__m256i u, __m256i s) {  // 8 int32 partial sums of u8 x s8 products, u8 < 128 only here
#ifdef PD_VNNI
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// 8 exact int32 partial sums of q8 codes q (stored as u8 = q + 128) times s8 activations x. AVX2's maddubs
// saturates at int16 (255 * 127 * 2 > 32767: silently wrong sums on CPUs without VNNI), so there the codes go
// back to s8 and multiply as |q| * sign(x, q) (at most 128 * 127 * 2), as llama.cpp does: the sums of q x.
// VNNI's dpbusd sums u x in int32; dot_tile takes the + 128 out once a block as 128 * isum (kQ8Offset).
#ifdef PD_VNNI
constexpr bool kQ8Offset = true;
#else
constexpr bool kQ8Offset = false;
#endif
inline __m256i dot_q8(__m256i u, __m256i x) {
#ifdef PD_VNNI
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x);
#else
  const __m256i offset = _mm256_set1_epi8((char)0x80);
  const __m256i q = _mm256_xor_si256(u, offset);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q)),
                           _mm256_set1_epi16(1));
#endif
}

// 8 fp16 scales from p on; lanes past the row's end read the next row's (finite) scales or the tensor's
// padding (kScalePad), and meet zero sums and zero activation scales there.
inline __m256 load_halfs(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }

// Two consecutive blocks (j, j+1) of one weight row, unpacked once and met by every activation row of a tile.
// q4: one 32-byte load of both blocks' nibbles; the low nibbles meet x[0:16] of both blocks, the high ones
// x[16:32] (quantize_rows' pair layout); an odd last block of a row is unpacked alone.
// q8: codes stored as u8 = q + 128 (dpbusd multiplies u8 by s8); the +128 is taken out through c.
struct Pair {
  __m256i a, b;
  int blocks;  // 2, 1 (odd last block), 0 (past the row's end)
};

template <int F>
inline Pair load_pair(const Weights& w, int64_t n, int64_t j, int64_t left) {
  const __m256i low = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
  if (left <= 0) return {zero, zero, 0};
  if (F == kQ5) {  // q5.h's pair: 32 nibble bytes, then the fifth bits of the low and the high nibbles
    const uint8_t* p = w.qs + (n * w.nb + j) * q5::kBytes;
    if (left >= 2) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)p);
      uint64_t h;
      std::memcpy(&h, p + 32, 8);
      return {_mm256_or_si256(_mm256_and_si256(v, low), q5::spread((uint32_t)h)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), q5::spread((uint32_t)(h >> 32))), 2};
    }
    return {q5::codes(w.qs + n * w.nb * q5::kBytes, w.nb, j), zero, 1};
  }
  if (F == kQ4) {
    if (left >= 2) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)(w.qs + (n * w.nb + j) * 16));
      return {_mm256_and_si256(v, low), _mm256_and_si256(_mm256_srli_epi16(v, 4), low), 2};
    }
    const __m128i raw = _mm_loadu_si128((const __m128i*)(w.qs + (n * w.nb + j) * 16));
    return {_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low), zero, 1};
  }
  const __m256i* p = (const __m256i*)(w.qs + (n * w.nb + j) * 32);
  return {_mm256_loadu_si256(p), left >= 2 ? _mm256_loadu_si256(p + 1) : zero, left >= 2 ? 2 : 1};
}

// int32 partial sums of the pair against activation blocks at x: lanes 0-3 block j, lanes 4-7 block j+1
template <int F>
inline __m256i dot_pair(const Pair& w, const int8_t* x) {
  constexpr bool Q4 = nibbled(F);
  const __m256i zero = _mm256_setzero_si256();
  if (w.blocks == 0) return zero;
  const __m256i x0 = _mm256_loadu_si256((const __m256i*)x);
  const __m256i x1 = w.blocks == 2 ? _mm256_loadu_si256((const __m256i*)(x + kBlock)) : zero;
  if (Q4 && w.blocks == 2) return _mm256_add_epi32(dot_u8s8(w.a, x0), dot_u8s8(w.b, x1));
  if (Q4) {
    const __m256i p = dot_u8s8(w.a, x0);
    return _mm256_zextsi128_si256(_mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
  }
  // hadd: [p0 01, p0 23, p1 01, p1 23 | p0 45, p0 67, p1 45, p1 67] -> lanes 0-3 block j, 4-7 block j+1
  return _mm256_permute4x64_epi64(_mm256_hadd_epi32(dot_q8(w.a, x0), dot_q8(w.b, x1)), 0xd8);
}

// out[r * ldo + c] = row n0 + c of W . activation row m0 + r, for r < MT, c < NT.
// Blocks go in groups of 8: each block's int32 dot product is reduced exactly (hadd tree) to one lane of a
// vector, then one fma per group scales the 8 blocks by d_w * d_x. Every (r, c) pair has its own chain
// of the same operations in the same order, so the tile shape (MT, NT) never changes a result.
template <int MT, int NT, int F>
inline void dot_tile(const Weights& w, int64_t n0, const QuantAct& a, int64_t m0, float* out, int64_t ldo) {
  constexpr bool Q4 = nibbled(F);
  __m256 acc[MT][NT], mins[MT][NT];
  for (int r = 0; r < MT; ++r)
    for (int c = 0; c < NT; ++c) acc[r][c] = mins[r][c] = _mm256_setzero_ps();
  const int64_t nb = w.nb;
  const int64_t bpb = F == kQ5 ? q5::kBytes : Q4 ? 16 : 32;  // code bytes a block
  for (int64_t j0 = 0; j0 < nb; j0 += 8) {
    const int64_t len = std::min<int64_t>(8, nb - j0);
    {  // the weight streams kPrefetch bytes of codes ahead (on into the next rows)
      const char* q = (const char*)(w.qs + (n0 * nb + j0) * bpb) + kPrefetch;
      for (int64_t b = 0; b < 8 * bpb; b += 64) _mm_prefetch(q + b, _MM_HINT_T0);
      const int64_t ahead = kPrefetch / bpb;
      _mm_prefetch((const char*)(w.d + n0 * nb + j0 + ahead), _MM_HINT_T0);
      if (Q4) _mm_prefetch((const char*)(w.m + n0 * nb + j0 + ahead), _MM_HINT_T0);
    }
    __m256i half[MT][NT], sums[MT][NT];
    for (int k = 0; k < 4; ++k) {
      const int64_t j = j0 + 2 * k;
      Pair p[NT];
      for (int c = 0; c < NT; ++c) p[c] = load_pair<F>(w, n0 + c, j, len - 2 * k);
      for (int r = 0; r < MT; ++r) {
        const int8_t* x = a.q.data() + ((m0 + r) * nb + j) * kBlock;
        for (int c = 0; c < NT; ++c) {
          const __m256i q = dot_pair<F>(p[c], x);
          if (k % 2 == 0) {
            sums[r][c] = q;
          } else if (k == 1) {
            half[r][c] = _mm256_hadd_epi32(sums[r][c], q);
          } else {  // [b0 b2 b4 b6 | b1 b3 b5 b7]
            sums[r][c] = _mm256_hadd_epi32(half[r][c], _mm256_hadd_epi32(sums[r][c], q));
          }
        }
      }
    }
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int c = 0; c < NT; ++c) {
      const __m256 dw = load_halfs(w.d + (n0 + c) * nb + j0);
      const __m256 zw = Q4 ? _mm256_fmadd_ps(_mm256_set1_ps(centre(F)), dw, load_halfs(w.m + (n0 + c) * nb + j0)) : dw;
      for (int r = 0; r < MT; ++r) {
        const int64_t at = (m0 + r) * a.nbp + j0;
        __m256i exact = _mm256_permutevar8x32_epi32(sums[r][c], order);
        if (!Q4 && kQ8Offset)  // u x - 128 x: the block sums of q x (padding blocks: 0 - 0)
          exact = _mm256_sub_epi32(exact, _mm256_slli_epi32(_mm256_loadu_si256((const __m256i*)(a.isum.data() + at)), 7));
        const __m256 blocks = _mm256_cvtepi32_ps(exact);
        acc[r][c] = _mm256_fmadd_ps(blocks, _mm256_mul_ps(dw, _mm256_loadu_ps(a.d.data() + at)), acc[r][c]);
        if (Q4) {  // w = d (q - 8) + z: the block offset z meets the exact sum of x, the -8 d the int8 sum
          __m256 c8 = _mm256_loadu_ps(a.c.data() + at);  // 8 d_x isum; q5's 16 d_x isum is exactly twice it
          if (F == kQ5) c8 = _mm256_add_ps(c8, c8);
          mins[r][c] = _mm256_fmadd_ps(zw, _mm256_loadu_ps(a.s.data() + at), mins[r][c]);
          mins[r][c] = _mm256_fnmadd_ps(dw, c8, mins[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < MT; ++r)
    for (int c = 0; c < NT; ++c) out[r * ldo + c] = hsum(acc[r][c]) + hsum(mins[r][c]);
}

// g = silu(g) * u; a tail shorter than 8 goes through the same vector arithmetic (zero-padded), so an element's
// result never depends on where a thread's range of columns ends.
inline void silu_mul(float* g, const float* u, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  auto eight = [&](float* gp, const float* up) {
    const __m256 x = _mm256_loadu_ps(gp);
    const __m256 e = exp_neg(_mm256_or_ps(x, sign));  // exp(-|x|)
    const __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 sig = _mm256_div_ps(_mm256_blendv_ps(one, e, neg), _mm256_add_ps(one, e));
    _mm256_storeu_ps(gp, _mm256_mul_ps(_mm256_mul_ps(x, sig), _mm256_loadu_ps(up)));
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) eight(g + i, u + i);
  if (i < n) {
    alignas(32) float gt[8] = {}, ut[8] = {};
    std::memcpy(gt, g + i, (n - i) * sizeof(float));
    std::memcpy(ut, u + i, (n - i) * sizeof(float));
    eight(gt, ut);
    std::memcpy(g + i, gt, (n - i) * sizeof(float));
  }
}
#else
template <int MT, int NT, int F>
inline void dot_tile(const Weights& w, int64_t n0, const QuantAct& a, int64_t m0, float* out, int64_t ldo) {
  constexpr bool Q4 = nibbled(F);
  for (int r = 0; r < MT; ++r) {
    for (int c = 0; c < NT; ++c) {
      const int64_t n = n0 + c;
      float acc = 0.0f, mins = 0.0f;
      for (int64_t j = 0; j < w.nb; ++j) {
        const int64_t blk = (m0 + r) * a.nbp + j;
        const int8_t* xq = a.q.data() + ((m0 + r) * w.nb + j) * kBlock;
        int32_t s = 0;
        for (int i = 0; i < kBlock; ++i) {
          int wq;
          if (F == kQ5) {
            wq = q5::code(w.qs + n * w.nb * q5::kBytes, w.nb, j, i);
          } else if (Q4) {
            const uint8_t b = w.qs[(n * w.nb + j) * 16 + (i & 15)];
            wq = i < 16 ? (b & 15) : (b >> 4);
          } else {
            wq = (int)w.qs[(n * w.nb + j) * 32 + i] - 128;  // u8 = q + 128
          }
          s += wq * xq[i];
        }
        const float dw = half_to_float(w.d[n * w.nb + j]);
        acc += (float)s * (dw * a.d[blk]);
        if (Q4)
          mins += (half_to_float(w.m[n * w.nb + j]) + centre(F) * dw) * a.s[blk] - dw * a.c[blk] * (centre(F) / 8);
      }
      out[r * ldo + c] = acc + mins;
    }
  }
}

inline void silu_mul(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}
#endif

// out[m] = row n of W . activation row m, for all M rows: 4 activation rows share each unpacked weight row.
// Weight rows go strictly one after another: tiles that interleaved 2-4 weight rows read 2.7x slower from
// DRAM (the prefetchers lose the streams; 4.9 vs 13 GB/s for the q8 head, measured), and software
// prefetching did not win that back.
template <int F>
void weight_row(const Weights& w, const QuantAct& a, int64_t M, int64_t n, float* out) {
  if (F == kQ6) {
    q6::weight_row(w.qs, w.K, a.q.data(), a.d.data(), a.xs16.data(), a.nbp, M, n, out);
    return;
  }
  if (F == kQ4K) {
    q4k::weight_row(w.qs, w.K, a.k, M, n, out);
    return;
  }
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) dot_tile<4, 1, F>(w, n, a, m, out + m, 1);
  for (; m < M; ++m) dot_tile<1, 1, F>(w, n, a, m, out + m, 1);
}

// q4k16: y rows [n0, n1) (multiples of 16) a group at a time; SwiGLU's gate and up groups in turn
void compute_groups(const Weights& w, const QuantAct& a, int64_t M, int64_t Nout, Act act, int64_t n0, int64_t n1,
                    float* y) {
  using q4k16::kRows;
  thread_local std::vector<float> gate, up;
  gate.resize(M * kRows);
  up.resize(M * kRows);
  for (int64_t n = n0; n < n1; n += kRows) {
    q4k16::group_rows(w.qs, w.K, a.k, M, n / kRows, gate.data());
    if (act == kSwiGLU) {
      q4k16::group_rows(w.qs, w.K, a.k, M, (n + Nout) / kRows, up.data());
      silu_mul(gate.data(), up.data(), M * kRows);
    }
    for (int64_t m = 0; m < M; ++m) std::memcpy(y + m * Nout + n, gate.data() + m * kRows, kRows * sizeof(float));
  }
}

// y (M, Nout) for rows [n0, n1) of the output; SwiGLU pairs gate row i with up row i + Nout.
template <int F>
void compute(const Weights& w, const QuantAct& a, int64_t M, int64_t Nout, Act act, int64_t n0, int64_t n1, float* y) {
  thread_local std::vector<float> buf, gate, up;
  buf.resize(M);
  const int64_t len = n1 - n0;
  if (act == kNone) {
    for (int64_t n = n0; n < n1; ++n) {
      weight_row<F>(w, a, M, n, buf.data());
      for (int64_t m = 0; m < M; ++m) y[m * Nout + n] = buf[m];
    }
    return;
  }
  gate.resize(M * len);
  up.resize(M * len);
  for (int64_t n = n0; n < n1; ++n) {  // gate rows, then up rows: each pass streams its own half of W
    weight_row<F>(w, a, M, n, buf.data());
    for (int64_t m = 0; m < M; ++m) gate[m * len + n - n0] = buf[m];
  }
  for (int64_t n = n0; n < n1; ++n) {
    weight_row<F>(w, a, M, n + Nout, buf.data());
    for (int64_t m = 0; m < M; ++m) up[m * len + n - n0] = buf[m];
  }
  for (int64_t m = 0; m < M; ++m) {
    silu_mul(gate.data() + m * len, up.data() + m * len, len);
    std::memcpy(y + m * Nout + n0, gate.data() + m * len, len * sizeof(float));
  }
}

#ifdef PD_AVX2
// The panel of output columns n0..n0+cols: unpacked into `panel`, or (q8g) viewed where it lies (its scales
// converted into `dw`). q4k's panels come from q4k.h's unpacker and take q4k.h's own tile (integer sub-block
// scales).
template <int F>
gemm::View unpack(const Weights& w, int64_t n0, int cols, gemm::Panel& panel, std::vector<float>& dw) {
  if (F == kQ8G) return q8g::view(w.qs, w.d, w.nb, n0 / q8g::kRows, dw);
  if (F == kQ4K16) {
    q4k16::unpack_panel(w.qs, w.nb, n0 / q4k16::kRows, panel);
  } else if (F == kQ4K) {
    q4k::unpack_panel(w.qs, w.nb, n0, cols, panel);
  } else {
    gemm::unpack_panel(w.qs, w.d, w.m, w.nb, F, n0, cols, panel);
  }
  return panel.view();
}

// The prompt-rows path (qgemm.h): y (M, Nout) for panels [p0, p1) of gemm::kCols output columns each; SwiGLU
// computes the gate and the up panel of the same columns, then silu(gate) * up.
template <int F>
void gemm_compute(const Weights& w, const gemm::Act& a, const q4k::ActK& ak, int64_t M, int64_t Nout, Act act,
                  int64_t p0, int64_t p1, float* y) {
  using gemm::kCols;
  constexpr bool Q4K = F == kQ4K || F == kQ4K16;
  constexpr int G = Q4K ? (int)gemm::kQ4 : F == kQ8G ? (int)gemm::kQ8 : F;
  thread_local gemm::Panel panel;
  thread_local std::vector<float> gate, up, dw;
  auto rows = [&](const gemm::View& v, float* o, int64_t ldo, int cols) {
    if constexpr (Q4K) {
      q4k::panel_rows(panel, ak, w.K, M, o, ldo, cols);
    } else {
      gemm::panel_rows<G>(v, a, M, o, ldo, cols);
    }
  };
  for (int64_t pi = p0; pi < p1; ++pi) {
    const int64_t n0 = pi * kCols;
    const int cols = (int)std::min<int64_t>(kCols, Nout - n0);
    if (act == kNone) {
      rows(unpack<F>(w, n0, cols, panel, dw), y + n0, Nout, cols);
      continue;
    }
    gate.resize(M * kCols);
    up.resize(M * kCols);
    rows(unpack<F>(w, n0, cols, panel, dw), gate.data(), kCols, cols);
    rows(unpack<F>(w, n0 + Nout, cols, panel, dw), up.data(), kCols, cols);
    for (int64_t m = 0; m < M; ++m) {
      silu_mul(gate.data() + m * kCols, up.data() + m * kCols, cols);
      std::memcpy(y + m * Nout + n0, gate.data() + m * kCols, cols * sizeof(float));
    }
  }
}
#endif

// Rows from which the GEMM path takes over, per format (PAGEDECK_QGEMM_ROWS overrides it for all: benchmarks
// and tests compare the two paths in one process; both compute every element identically). The GEMM path
// unpacks every weight into panels once per call, a cost the rows must amortise; q4k's per-row kernel (16-row
// groups, one dpbusd per 4 codes into each row's lane) is cheap enough that it stays ahead up to ~28 rows: the
// whole decode step of the 3B- and 8B-shaped Q4_K_M files at 8 rows ran 1.40x / 1.54x faster with it than with
// the GEMM, 1.20x / 1.20x at 16, 1.05x / 1.13x at 24, and 0.95x on the 3B at 32. q4, q8 and q6 cross near 8.
// The overrides of gemm_rows and row_chunk below (kUnset: none): PAGEDECK_QGEMM_ROWS and PAGEDECK_ROW_CHUNK,
// given once when the extension loads (kernels/cpu_ext.py, set_tuning) and by benchmarks and tests comparing
// paths in one process (cpu_ext.set_tuning); a matmul reads these, never the environment.
constexpr int64_t kUnset = std::numeric_limits<int64_t>::min();
std::atomic<int64_t> forced_gemm_rows{kUnset}, forced_row_chunk{kUnset};

int64_t gemm_rows(Format f) {
  const int64_t forced = forced_gemm_rows.load(std::memory_order_relaxed);
  if (forced != kUnset) return forced;
  return f == kQ4K || f == kQ4K16 ? 32 : 8;
}

// Output rows per chunk of the per-row path, one activation row: ~kChunkBytes of weights, so that each thread
// streams long contiguous runs (16-row chunks, 36 KB of a 4096-wide Q4_K matrix, interleaved the two threads'
// reads every 36 KB: the 8B-shaped file's whole step was 1.22-1.28x slower with them than with 64-256 rows,
// alternated in one process), but at least 4 chunks a thread so that the threads still finish together on
// small matrices (a chunk is the most one thread can be left doing alone); several activation rows, 8 rows.
// PAGEDECK_ROW_CHUNK overrides it (benchmarks compare splits in one process; 0: one range per thread).
constexpr int64_t kChunkBytes = 512 << 10;

int64_t row_chunk(int64_t Nout, int64_t M, int64_t row_bytes) {
  const int64_t forced = forced_row_chunk.load(std::memory_order_relaxed);
  const int64_t threads = at::get_num_threads();
  if (forced != kUnset) return forced > 0 ? forced : (Nout + threads - 1) / threads;
  if (M > 1) return 8;
  const int64_t rows = std::min(kChunkBytes / std::max<int64_t>(row_bytes, 1), Nout / (4 * threads));
  return std::max<int64_t>(16, rows / 16 * 16);
}

}  // namespace

at::Tensor qmatmul(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, const c10::optional<at::Tensor>& m,
                   int64_t act) {
  check_cpu_f32(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be (M, K)");
  const bool q4 = m.has_value();
  const int64_t M = x.size(0), K = x.size(1), nb = K / kBlock;
  TORCH_CHECK(K % kBlock == 0, "K must be a multiple of 32, got ", K);
  // the format: q4 has minimums; q6 rows are K / 256 super-blocks of 210 bytes, q4k of 144, q4k16's groups of
  // 16 rows K / 256 x 2304 bytes, q8 rows K bytes, q8g's groups K / 32 x 512
  const bool sup = !q4 && K % q4k::kSuper == 0 && qs.dim() == 2;
  const int64_t nsb = K / q4k::kSuper;
  const bool q6 = sup && qs.size(1) == nsb * q6::kBytes, q4k = sup && qs.size(1) == nsb * q4k::kBytes;
  const bool q4k16 = sup && qs.size(1) == nsb * q4k16::kGroupBytes;
  const bool q5 = q4 && qs.dim() == 2 && qs.size(1) == nb * q5::kBytes;  // minimums and a fifth bit plane
  const bool q8g = !q4 && qs.dim() == 2 && qs.size(1) == nb * q8g::kBlockBytes;  // 16 K: no other format's
  const int64_t N = q4k16 ? qs.size(0) * q4k16::kRows : q8g ? qs.size(0) * q8g::kRows : qs.size(0);
  TORCH_CHECK(qs.is_contiguous() && qs.dim() == 2 &&
                  (q6 || q4k || q4k16 || q5 || q8g || qs.size(1) == (q4 ? K / 2 : K)) &&
                  qs.scalar_type() == at::kByte,
              "packed weights do not match x's K or the format");
  auto padded = [&](const at::Tensor& t) {  // kernels read up to 7 scales past the last row's end
    return t.scalar_type() == at::kHalf && t.is_contiguous() && t.dim() == 2 && t.size(0) == N && t.size(1) == nb &&
           (int64_t)t.storage().nbytes() >= (t.storage_offset() + N * nb + kScalePad) * 2;
  };
  TORCH_CHECK(!q8g || (d.scalar_type() == at::kHalf && d.is_contiguous() && d.dim() == 2 &&
                        d.size(0) == qs.size(0) && d.size(1) == nb * q8g::kRows),
              "q8g scales must be (N/16, K/32 * 16) fp16");
  TORCH_CHECK(q6 || q4k || q4k16 || q8g || padded(d), "scales must be (N, K/32) fp16 with ", kScalePad,
              " values of padding after them");
  TORCH_CHECK(!q4 || padded(*m), "minimums must be (N, K/32) fp16 with ", kScalePad, " values of padding after them");
  TORCH_CHECK(act == kNone || (act == kSwiGLU && N % (q4k16 || q8g ? 2 * kGroupRows : 2) == 0), "bad activation");
  const int64_t Nout = act == kSwiGLU ? N / 2 : N;
  at::Tensor y = at::empty({M, Nout}, x.options());
  if (M == 0) return y;
  QuantAct& a = scratch();
#ifdef PD_AVX2
  const bool big = q8g || M >= gemm_rows(q5 ? kQ5 : q4 ? kQ4 : q6 ? kQ6 : q4k ? kQ4K : q4k16 ? kQ4K16 : kQ8);
#else
  TORCH_CHECK(!q8g, "q8g weights need the AVX2 kernels");
  const bool big = false;
#endif
  if (q4k || q4k16) {
    q4k::quantize_k(x.data_ptr<float>(), M, K, a.k);
  } else {
    quantize_rows(x.data_ptr<float>(), M, K, a, q4 && !big, q6);
  }
  Weights w{(const uint8_t*)qs.data_ptr(), q6 || q4k || q4k16 ? nullptr : (const uint16_t*)d.data_ptr(),
            q4 ? (const uint16_t*)m->data_ptr() : nullptr, K, nb};
  float* out = y.data_ptr<float>();
  const Act ac = (Act)act;
#ifdef PD_AVX2
  if (big) {
    const gemm::Act ga{a.q.data(), a.d.data(), a.s.data(), a.c.data(), a.isum.data(), nb, a.nbp, a.xs16.data()};
    // Panels go out in chunks from a shared counter, not in one fixed share per thread: on a machine shared
    // with other processes a descheduled thread's half held the call up (a 512-row prefill ran at one
    // thread's speed). Every element's arithmetic is the same whichever thread takes its panel.
    const int64_t panels = (Nout + gemm::kCols - 1) / gemm::kCols, threads = at::get_num_threads();
    const int64_t chunk = std::max<int64_t>(1, panels / (8 * threads));
    std::atomic<int64_t> next{0};
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
      for (int64_t p0; (p0 = next.fetch_add(chunk)) < panels;) {
        const int64_t p1 = std::min(panels, p0 + chunk);
        if (q5) {
          gemm_compute<kQ5>(w, ga, a.k, M, Nout, ac, p0, p1, out);
        } else if (q4) {
          gemm_compute<kQ4>(w, ga, a.k, M, Nout, ac, p0, p1, out);
        } else if (q6) {
          gemm_compute<kQ6>(w, ga, a.k, M, Nout, ac, p0, p1, out);
        } else if (q4k) {
          gemm_compute<kQ4K>(w, ga, a.k, M, Nout, ac, p0, p1, out);
        } else if (q4k16) {
          gemm_compute<kQ4K16>(w, ga, a.k, M, Nout, ac, p0, p1, out);
        } else if (q8g) {
          gemm_compute<kQ8G>(w, ga, a.k, M, Nout, ac, p0, p1, out);
        } else {
          gemm_compute<kQ8>(w, ga, a.k, M, Nout, ac, p0, p1, out);
        }
      }
    });
    return y;
  }
#endif
  // Output rows go in chunks taken from a shared counter (ggml's scheme), not in one fixed range per thread:
  // on a shared machine a thread that loses its core for a while no longer leaves the other waiting at the
  // join with its whole half still to do. Each row's result is the same whichever thread computes it.
  int64_t chunk = row_chunk(Nout, M, qs.numel() / N);  // a row's bytes (q4's scales and minimums aside)
  if (q4k16) chunk = (chunk + q4k16::kRows - 1) / q4k16::kRows * q4k16::kRows;  // whole groups
  const int64_t chunks = (Nout + chunk - 1) / chunk;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), chunks), 1, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      const int64_t n0 = c * chunk, n1 = std::min(Nout, n0 + chunk);
      if (q5) {
        compute<kQ5>(w, a, M, Nout, ac, n0, n1, out);
      } else if (q4) {
        compute<kQ4>(w, a, M, Nout, ac, n0, n1, out);
      } else if (q6) {
        compute<kQ6>(w, a, M, Nout, ac, n0, n1, out);
      } else if (q4k) {
        compute<kQ4K>(w, a, M, Nout, ac, n0, n1, out);
      } else if (q4k16) {
        compute_groups(w, a, M, Nout, ac, n0, n1, out);
      } else {
        compute<kQ8>(w, a, M, Nout, ac, n0, n1, out);
      }
    }
  });
  return y;
}

// The two overrides (None: the rule), and what is set now (kUnset where none), for cpu_ext and its tests.
void set_tuning(c10::optional<int64_t> gemm_rows_from, c10::optional<int64_t> chunk) {
  forced_gemm_rows.store(gemm_rows_from.value_or(kUnset));
  forced_row_chunk.store(chunk.value_or(kUnset));
}

std::vector<int64_t> get_tuning() { return {forced_gemm_rows.load(), forced_row_chunk.load()}; }

TORCH_LIBRARY_FRAGMENT(pagedeck, lib) {
  lib.def("set_tuning(int? qgemm_rows, int? row_chunk) -> ()", &set_tuning);
  lib.def("get_tuning() -> int[]", &get_tuning);
  lib.def("qmatmul(Tensor x, Tensor qs, Tensor d, Tensor? m, int act) -> Tensor", &qmatmul);
}

}  // namespace pagedeck
