// One call per layer: rotary on q and k, K/V written into the paged pools, and causal attention of each
// sequence's query rows over its pages. The pools are fp32 or fp16 (both alike):
// an fp16 pool halves the bytes a decode step reads, which is what the step's attention is bound by (each
// cached position is read once per layer and KV head; the arithmetic on it is a few FMAs per byte), so its
// rows are converted to fp32 as they are loaded (F16C's vcvtph2ps) and the new K/V are rounded to nearest
// even on the way in, as torch's .to(float16) rounds.
//
// Token i of sequence b sits at position kv_lens[b] - q_len_b + i and attends to positions 0..that one
// (decode, speculative verification, prefill chunks). Sequences with more than max_q query rows are only
// rotated and written: the caller attends them on the returned rotated q. Work is split into (sequence, kv
// head, context slice) tasks for decode-sized sequences, (sequence, kv head, block of kRows query rows) tasks
// for longer chunks, with an online softmax per slice, slices merged by log-sum-exp, so a long context and a
// long chunk also spread over the threads. All K/V is written before any is read, so every row attends over
// the K/V as the pools store it (fp16 rounding included), its own chunk's too.
// A row's bits depend on its position and its sequence's pages only: slices are fixed kSlice-wide spans of
// positions, scoring chunks start at fixed positions, and a row's softmax never mixes with another row's. So
// the result never depends on what else is in the batch, nor on how a prompt was cut into chunks (a job
// preempted and resumed recomputes its K/V in other chunks and gets the same bits).
// GQA: a KV head's G query heads run in one task, a decode slice's KV heads too where the tasks are many.
// Per-layer options of the architectures beyond Llama's: q/k RMSNorm per head before the rotation (Qwen3,
// Gemma 3), rotation of the first dims only (the cos/sin tables' width), a sliding window (a row at position p
// sees positions > p - window), soft-capped scores (c tanh(s / c), Gemma 2) and sink logits (gpt-oss). A row's
// window starts at its own position, so these keep the bits' independence from the batch and the chunking.
#include "common.h"
#include "ops.h"

#include <torch/library.h>

#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

namespace pagedeck {
namespace {

constexpr int64_t kChunk = 64;     // positions scored at once
constexpr int64_t kSlice = 512;     // context positions per task: slice s is positions [s kSlice, (s + 1) kSlice)
constexpr int64_t kRows = 16;       // query rows of one long chunk per task
constexpr int64_t kTasksPerThread = 4;  // decode slices a thread from which a task takes every KV head
// K rows are prefetched this many positions ahead, V rows as their K rows are read (the V pass follows within
// the chunk): one core's loads alone leave the hardware prefetchers short of DRAM's bandwidth (common.h)
constexpr int64_t kAhead = 16;

template <typename T>
inline void prefetch_row(const T* p, int64_t D) {
  for (int64_t b = 0; b < D * (int64_t)sizeof(T); b += 64) __builtin_prefetch((const char*)p + b, 0, 3);
}

inline void rotate(const float* x, const float* c, const float* s, int64_t half, float* out) {
  int64_t i = 0;
#ifdef PD_AVX2
  for (; i + 8 <= half; i += 8) {
    const __m256 x1 = _mm256_loadu_ps(x + i), x2 = _mm256_loadu_ps(x + half + i);
    const __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
    _mm256_storeu_ps(out + i, _mm256_fmsub_ps(x1, cv, _mm256_mul_ps(x2, sv)));
    _mm256_storeu_ps(out + half + i, _mm256_fmadd_ps(x2, cv, _mm256_mul_ps(x1, sv)));
  }
#endif
  for (; i < half; ++i) {
    const float a = x[i], b = x[half + i];
    out[i] = a * c[i] - b * s[i];
    out[half + i] = b * c[i] + a * s[i];
  }
}

// x's RMSNorm (x / sqrt(mean(x^2) + eps) * w) into out, n floats: a head's q/k norm
inline void head_norm(const float* x, const float* w, float eps, int64_t n, float* out) {
  float ss = 0.0f;
  int64_t i = 0;
#ifdef PD_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  ss = hsum(acc);
#endif
  for (; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / (float)n + eps);
  for (i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

// A head's row as attention takes it: normed (w not null), its first 2 rh dims rotated, the rest copied
inline void prepare_head(const float* x, const float* w, float eps, const float* c, const float* s, int64_t rh,
                         int64_t D, float* tmp, float* out) {
  if (w != nullptr) {
    head_norm(x, w, eps, D, tmp);
    x = tmp;
  }
  rotate(x, c, s, rh, out);
  if (2 * rh < D) std::memcpy(out + 2 * rh, x + 2 * rh, (D - 2 * rh) * sizeof(float));
}

// Scores soft-capped in place: s = cap tanh(s / cap) (cap > 0)
inline void soft_cap(float* s, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) s[i] = cap * std::tanh(s[i] / cap);
}

// A pool element as fp32: pools hold float or fp16 (uint16_t bits).
inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) { return half_to_float(*p); }
#ifdef PD_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return load_halfs(p); }
#endif

// x (n floats) into a pool row: copied, or rounded to fp16 (nearest even, as torch's .to(float16))
inline void store_row(const float* x, int64_t n, float* dst) { std::memcpy(dst, x, n * sizeof(float)); }
inline void store_row(const float* x, int64_t n, uint16_t* dst) {
  int64_t i = 0;
#ifdef PD_AVX2
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i*)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) dst[i] = c10::Half(x[i]).x;
}

template <typename T>
inline float dot(const float* a, const T* b, int64_t D) {
  int64_t i = 0;
  float r = 0.0f;
#ifdef PD_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= D; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), acc);
  r = hsum(acc);
#endif
  for (; i < D; ++i) r += a[i] * load1(b + i);
  return r;
}

template <typename T>
inline void axpy(float p, const T* v, float* acc, int64_t D) {
  int64_t i = 0;
#ifdef PD_AVX2
  const __m256 pv = _mm256_set1_ps(p);
  for (; i + 8 <= D; i += 8) _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(pv, load8(v + i), _mm256_loadu_ps(acc + i)));
#endif
  for (; i < D; ++i) acc[i] += p * load1(v + i);
}

inline float exp_sum(float* x, int64_t n, float mx) {  // x = exp(x - mx), returns the sum
  int64_t i = 0;
  float total = 0.0f;
#ifdef PD_AVX2
  const __m256 m = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  total = hsum(acc);
#endif
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    total += x[i];
  }
  return total;
}

struct Partial {  // online-softmax state of one query row over one context slice
  float max, sum;
};

// The largest of n scores and an accumulator rescaled, as vector loops: a maximum is exact in any order and a
// product lane by lane is the scalar one, so the bits are the scalar loops' (whose chain of maxima, one a
// score, slowed every chunk).
inline float max_of(const float* s, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  int64_t p = 0;
#ifdef PD_AVX2
  if (n >= 16) {
    __m256 m0 = _mm256_loadu_ps(s), m1 = _mm256_loadu_ps(s + 8);
    for (p = 16; p + 16 <= n; p += 16) {
      m0 = _mm256_max_ps(m0, _mm256_loadu_ps(s + p));
      m1 = _mm256_max_ps(m1, _mm256_loadu_ps(s + p + 8));
    }
    mx = hmax(_mm256_max_ps(m0, m1));
  }
#endif
  for (; p < n; ++p) mx = std::max(mx, s[p]);
  return mx;
}

inline void scale_by(float* a, int64_t D, float alpha) {
  int64_t d = 0;
#ifdef PD_AVX2
  const __m256 f = _mm256_set1_ps(alpha);
  for (; d + 8 <= D; d += 8) _mm256_storeu_ps(a + d, _mm256_mul_ps(_mm256_loadu_ps(a + d), f));
#endif
  for (; d < D; ++d) a[d] *= alpha;
}

// Softmax bookkeeping of one head for a chunk of n scores: rescale the running sum and output to the new
// maximum, turn the scores into weights exp(s - max) and add them to the sum.
inline void online_softmax(float* s, int64_t n, Partial& st, float* a, int64_t D) {
  const float m_new = std::max(st.max, max_of(s, n));
  if (st.max != m_new && st.sum > 0.0f) {
    const float alpha = std::exp(st.max - m_new);
    scale_by(a, D, alpha);
    st.sum *= alpha;
  }
  st.max = m_new;
  st.sum += exp_sum(s, n, m_new);
}

// One query row's G heads (q: G x D) over n positions of K/V rows `stride` apart; st and A (G x D) carry
// each head's online softmax; scores has room for G x kChunk. `avail` >= n positions from K on lie in the same
// page (what may be prefetched).
template <typename T>
void chunk_generic(const float* q, int64_t G, const T* K, const T* V, int64_t stride, int64_t n, int64_t avail,
                   int64_t D, float sc, float cap, Partial* st, float* A, float* scores) {
  (void)avail;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t p = 0; p < n; ++p) scores[p] = sc * dot(q + g * D, K + p * stride, D);
    if (cap > 0.0f) soft_cap(scores, n, cap);
    online_softmax(scores, n, st[g], A + g * D, D);
    for (int64_t p = 0; p < n; ++p) axpy(scores[p], V + p * stride, A + g * D, D);
  }
}

#ifdef PD_AVX2
#ifdef PD_AVX512
constexpr int kVectorRegs = 32;  // AVX-512VL: ymm0-31
#else
constexpr int kVectorRegs = 16;
#endif
// The same for D % 64 == 0 with the G heads in registers: each K row load serves all G heads (4 positions
// at a time, their dot products reduced together), each V row load likewise.
template <int G, typename T>
void chunk_fast(const float* q, const T* K, const T* V, int64_t stride, int64_t n, int64_t avail, int64_t D,
                float sc, float cap, Partial* st, float* A, float* scores) {
  const __m256 scale = _mm256_set1_ps(sc);
  int64_t p = 0;
  for (; p + 4 <= n; p += 4) {
    __m256 acc[G][4];
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < 4; ++j) acc[g][j] = _mm256_setzero_ps();
    const T* k = K + p * stride;
    for (int64_t j = 0; j < 4; ++j) {
      if (p + kAhead + j < avail) prefetch_row(k + (kAhead + j) * stride, D);
      prefetch_row(V + (p + j) * stride, D);
    }
    for (int64_t d = 0; d < D; d += 8) {
      const __m256 k0 = load8(k + d), k1 = load8(k + stride + d), k2 = load8(k + 2 * stride + d),
                   k3 = load8(k + 3 * stride + d);
      for (int g = 0; g < G; ++g) {
        const __m256 qv = _mm256_loadu_ps(q + g * D + d);
        acc[g][0] = _mm256_fmadd_ps(qv, k0, acc[g][0]);
        acc[g][1] = _mm256_fmadd_ps(qv, k1, acc[g][1]);
        acc[g][2] = _mm256_fmadd_ps(qv, k2, acc[g][2]);
        acc[g][3] = _mm256_fmadd_ps(qv, k3, acc[g][3]);
      }
    }
    for (int g = 0; g < G; ++g) {  // lanes -> [dot p, dot p+1, dot p+2, dot p+3]
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[g][0], acc[g][1]), _mm256_hadd_ps(acc[g][2], acc[g][3]));
      const __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
      _mm_storeu_ps(scores + g * kChunk + p, _mm_mul_ps(r, _mm256_castps256_ps128(scale)));
    }
  }
  for (; p < n; ++p)
    for (int g = 0; g < G; ++g) scores[g * kChunk + p] = sc * dot(q + g * D, K + p * stride, D);
  for (int g = 0; g < G; ++g) {
    if (cap > 0.0f) soft_cap(scores + g * kChunk, n, cap);
    online_softmax(scores + g * kChunk, n, st[g], A + g * D, D);
  }
  // the weighted V rows in slices of J vectors of dims, G J accumulators kept in registers (a lane's sum over t
  // is the same sequence whatever the slice width)
  constexpr int J = kVectorRegs >= 32 ? (G <= 3 ? 8 : G <= 6 ? 4 : 2) : (G <= 1 ? 8 : G <= 3 ? 4 : G <= 6 ? 2 : 1);
  for (int64_t d0 = 0; d0 < D; d0 += 8 * J) {
    __m256 acc[G][J];
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < J; ++j) acc[g][j] = _mm256_loadu_ps(A + g * D + d0 + 8 * j);
    for (int64_t t = 0; t < n; ++t) {
      const T* v = V + t * stride + d0;
      for (int j = 0; j < J; ++j) {
        const __m256 vj = load8(v + 8 * j);
        for (int g = 0; g < G; ++g)
          acc[g][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(scores + g * kChunk + t), vj, acc[g][j]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < J; ++j) _mm256_storeu_ps(A + g * D + d0 + 8 * j, acc[g][j]);
  }
}
#endif

template <typename T>
using ChunkFn = void (*)(const float*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, float, float, Partial*,
                         float*, float*);

template <typename T>
ChunkFn<T> fast_chunk(int64_t G, int64_t D) {  // nullptr: use chunk_generic
#ifdef PD_AVX2
  if (D % 64 == 0) {
    switch (G) {
      case 1: return chunk_fast<1, T>;
      case 2: return chunk_fast<2, T>;
      case 3: return chunk_fast<3, T>;
      case 4: return chunk_fast<4, T>;
      case 5: return chunk_fast<5, T>;
      case 6: return chunk_fast<6, T>;
      case 7: return chunk_fast<7, T>;
      case 8: return chunk_fast<8, T>;
      default: break;
    }
  }
#endif
  (void)G;
  (void)D;
  return nullptr;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> attend(const at::Tensor& qkv, const at::Tensor& k_pool, const at::Tensor& v_pool,
                                          const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slot_mapping,
                                          const at::Tensor& block_table, const at::Tensor& cu_q,
                                          const at::Tensor& kv_lens, int64_t Hq, double scale, int64_t max_q,
                                          const c10::optional<at::Tensor>& sinks, const c10::optional<at::Tensor>& q_norm,
                                          const c10::optional<at::Tensor>& k_norm, double norm_eps, int64_t window,
                                          double softcap) {
  check_cpu_f32(qkv, "qkv");
  if (sinks.has_value()) {
    check_cpu_f32(*sinks, "sinks");
    TORCH_CHECK(sinks->dim() == 1 && sinks->size(0) == Hq && sinks->is_contiguous(),
                "sinks must be (Hq,) contiguous float32: one logit per query head");
  }
  const float* sink_logits = sinks.has_value() ? sinks->data_ptr<float>() : nullptr;
  TORCH_CHECK(k_pool.device().is_cpu() && k_pool.is_contiguous() && v_pool.device().is_cpu() &&
                  v_pool.is_contiguous() && k_pool.scalar_type() == v_pool.scalar_type() &&
                  (k_pool.scalar_type() == at::kFloat || k_pool.scalar_type() == at::kHalf),
              "k_pool and v_pool must be contiguous CPU tensors, both float32 or both float16");
  const bool half_pools = k_pool.scalar_type() == at::kHalf;
  check_cpu_f32(cos, "cos");
  check_cpu_f32(sin, "sin");
  TORCH_CHECK(k_pool.dim() == 4 && k_pool.sizes() == v_pool.sizes(), "pools must be (pages, page_size, Hkv, D)");
  const int64_t P = k_pool.size(0), ps = k_pool.size(1), Hkv = k_pool.size(2), D = k_pool.size(3);
  const int64_t T = qkv.size(0), half = D / 2, G = Hq / Hkv;
  TORCH_CHECK(Hq % Hkv == 0 && D % 2 == 0 && qkv.dim() == 2 && qkv.size(1) == (Hq + 2 * Hkv) * D,
              "qkv does not match the pools' heads");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.dim() == 2 && cos.size(0) == T && cos.size(1) <= half,
              "bad rotary tables: (T, rotated dims / 2) each, at most half the head");
  const int64_t rh = cos.size(1);
  TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "q_norm and k_norm go together");
  if (q_norm.has_value()) {
    check_cpu_f32(*q_norm, "q_norm");
    check_cpu_f32(*k_norm, "k_norm");
    TORCH_CHECK(q_norm->dim() == 1 && q_norm->size(0) == D && k_norm->dim() == 1 && k_norm->size(0) == D &&
                    q_norm->is_contiguous() && k_norm->is_contiguous(),
                "q_norm and k_norm must be (D,) contiguous float32: one weight per head dim");
  }
  const float* qn = q_norm.has_value() ? q_norm->data_ptr<float>() : nullptr;
  const float* kn = k_norm.has_value() ? k_norm->data_ptr<float>() : nullptr;
  const float neps = (float)norm_eps;
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: none)");
  TORCH_CHECK(softcap >= 0.0, "softcap must be >= 0 (0: none)");
  const float cap = (float)softcap;
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.numel() == T, "slot_mapping must be (T,) int64");
  TORCH_CHECK(block_table.scalar_type() == at::kInt && cu_q.scalar_type() == at::kInt &&
                  kv_lens.scalar_type() == at::kInt && block_table.is_contiguous() && cu_q.is_contiguous() &&
                  kv_lens.is_contiguous() && slot_mapping.is_contiguous(),
              "block_table, cu_q and kv_lens must be contiguous int32");
  const int64_t B = kv_lens.numel(), W = block_table.size(1);
  TORCH_CHECK(cu_q.numel() == B + 1 && block_table.size(0) == B, "cu_q / block_table do not match kv_lens");
  const int32_t* cu = cu_q.data_ptr<int32_t>();
  const int32_t* lens = kv_lens.data_ptr<int32_t>();
  const int32_t* table = block_table.data_ptr<int32_t>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  TORCH_CHECK(cu[0] == 0 && cu[B] == T, "cu_q must run from 0 to T");
  int64_t qmax = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t ql = cu[b + 1] - cu[b];
    TORCH_CHECK(ql >= 1 && ql <= lens[b] && lens[b] <= W * ps, "sequence ", b, ": bad q_len or kv_len");
    for (int64_t p = 0; p < (lens[b] + ps - 1) / ps; ++p) {
      TORCH_CHECK(table[b * W + p] >= 0 && table[b * W + p] < P, "block_table holds a page outside the pool");
    }
    if (ql <= max_q && ql <= kRows) qmax = std::max(qmax, ql);
  }
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(slots[t] >= 0 && slots[t] < P * ps, "slot_mapping outside the pool");

  // rotary on q (into a buffer) and k, k and v into their slots
  const float* x = qkv.data_ptr<float>();
  const float* cs = cos.data_ptr<float>();
  const float* sn = sin.data_ptr<float>();
  void* kp = k_pool.data_ptr();
  void* vp = v_pool.data_ptr();
  at::Tensor qrot = at::empty({T, Hq, D}, qkv.options());
  float* q = qrot.data_ptr<float>();
  const int64_t row = (Hq + 2 * Hkv) * D;
  std::vector<float> krot(D), tmp(D);
  const auto write = [&](auto* kw, auto* vw) {  // the pools' element type
    for (int64_t t = 0; t < T; ++t) {
      const float* r = x + t * row;
      const float *c = cs + t * rh, *s = sn + t * rh;
      for (int64_t h = 0; h < Hq; ++h) prepare_head(r + h * D, qn, neps, c, s, rh, D, tmp.data(), q + (t * Hq + h) * D);
      for (int64_t h = 0; h < Hkv; ++h) {
        prepare_head(r + (Hq + h) * D, kn, neps, c, s, rh, D, tmp.data(), krot.data());
        store_row(krot.data(), D, kw + (slots[t] * Hkv + h) * D);
        store_row(r + (Hq + Hkv + h) * D, D, vw + (slots[t] * Hkv + h) * D);
      }
    }
  };
  if (half_pools) {
    write((uint16_t*)kp, (uint16_t*)vp);
  } else {
    write((float*)kp, (float*)vp);
  }

  // Tasks. A sequence of at most kRows rows (decode, verification) gets one per slice, or per (kv head, slice)
  // where that would leave too few tasks for the threads, merged after all have run, so a long context spreads
  // over the threads. A slice task takes every KV head chunk by chunk: the pools hold a position's KV heads side
  // by side, so its K and V rows stream from memory in order (16 decode rows over 1000 positions of the default
  // model: attention 15.7-17.0 ms a step against 18.0-18.6 ms with a task per head). A longer chunk gets one per
  // (kv head, block of kRows rows) that runs the block's slices in turn and merges them itself, so its partial
  // results take a block's worth of memory, not the chunk's times its slices. Every head's slice is computed and
  // merged alike whichever task runs it.
  std::vector<int64_t> first_task(B + 1, 0), slices(B), first_acc(B + 1, 0);
  int64_t slice_tasks = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t ql = cu[b + 1] - cu[b];
    slices[b] = ql <= max_q ? (lens[b] + kSlice - 1) / kSlice : 0;
    if (ql <= kRows) slice_tasks += slices[b];
  }
  const int64_t heads_a_task = slice_tasks >= kTasksPerThread * at::get_num_threads() ? Hkv : 1;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t ql = cu[b + 1] - cu[b];
    const bool split = ql <= kRows;
    first_task[b + 1] = first_task[b] + (slices[b] == 0 ? 0 : split ? Hkv / heads_a_task * slices[b] : Hkv * ((ql + kRows - 1) / kRows));
    first_acc[b + 1] = first_acc[b] + (slices[b] != 0 && split ? Hkv * slices[b] : 0);
  }
  const int64_t tasks = first_task[B], nq = qmax * G;  // qmax: the longest split sequence's rows
  std::vector<float> acc(first_acc[B] * nq * D);
  std::vector<Partial> part(first_acc[B] * nq);
  at::Tensor out = at::empty({T, Hq * D}, qkv.options());
  float* o = out.data_ptr<float>();
  const float sc = (float)scale;
  // the output of row i's query head h * G + g from its slices' partial states (the one slice's, or kSlice-wide
  // ones one stride apart): o = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s; a head's sink logit z adds
  // exp(z - M) to the denominator (M then covers z too). A slice past the row's position holds nothing (sum 0).
  const auto merge = [&](int64_t b, int64_t i, int64_t h, int64_t g, const Partial* st, const float* A,
                         int64_t stride) {
    const float* sink = sink_logits == nullptr ? nullptr : sink_logits + h * G + g;
    float M = sink == nullptr ? -std::numeric_limits<float>::infinity() : *sink;
    for (int64_t s = 0; s < slices[b]; ++s) M = std::max(M, st[s * stride].max);
    float* dst = o + (cu[b] + i) * Hq * D + (h * G + g) * D;
    std::fill(dst, dst + D, 0.0f);
    float total = 0.0f;
    for (int64_t s = 0; s < slices[b]; ++s) {
      const Partial& p = st[s * stride];
      if (p.sum == 0.0f) continue;
      // a row reaching one slice gets w = exp(0) = 1 either way: its bits do not depend on its sequence's length
      const float w = slices[b] == 1 && sink == nullptr ? 1.0f : std::exp(p.max - M);
      total += w * p.sum;
      axpy(w, A + s * stride * D, dst, D);
    }
    if (sink != nullptr) total += std::exp(*sink - M);
    const float inv = 1.0f / total;
    for (int64_t d = 0; d < D; ++d) dst[d] *= inv;
  };
  const auto run = [&](const auto* kp, const auto* vp) {  // the pools' element type
    using Elem = std::remove_cv_t<std::remove_pointer_t<decltype(kp)>>;
    const ChunkFn<Elem> fast = fast_chunk<Elem>(G, D);
    // rows i0..i1 of sequence b, kv heads h0..h1, over slice s: each row's online softmax into st / A (head h's
    // state head_stride apart, row k - i0's G query heads at (k - i0) G within it); the heads take each chunk in
    // turn, so a chunk's K and V rows (a position's KV heads lie side by side in the pools) are read together;
    // the scoring chunks start at fixed positions whatever the rows
    const auto slice = [&](int64_t b, int64_t h0, int64_t h1, int64_t head_stride, int64_t s, int64_t i0, int64_t i1,
                           Partial* st0, float* A0, float* scores) {
      const int64_t len = lens[b], ql = cu[b + 1] - cu[b];
      const int64_t lo = s * kSlice, hi = std::min({len, lo + kSlice, len - ql + i1});  // up to the last row
      for (int64_t h = h0; h < h1; ++h) {
        std::fill(A0 + (h - h0) * head_stride * D, A0 + (h - h0) * head_stride * D + (i1 - i0) * G * D, 0.0f);
        for (int64_t j = 0; j < (i1 - i0) * G; ++j)
          st0[(h - h0) * head_stride + j] = {-std::numeric_limits<float>::infinity(), 0.0f};
      }
      for (int64_t c0 = lo; c0 < hi;) {  // chunks never cross a page
        const int64_t page = table[b * W + c0 / ps];
        const int64_t c1 = std::min({hi, c0 + kChunk, (c0 / ps + 1) * ps});
        for (int64_t h = h0; h < h1; ++h) {
          Partial* st = st0 + (h - h0) * head_stride;
          float* A = A0 + (h - h0) * head_stride * D;
          const Elem* K = kp + ((page * ps + c0 % ps) * Hkv + h) * D;
          const Elem* V = vp + ((page * ps + c0 % ps) * Hkv + h) * D;
          const int64_t stride = Hkv * D, avail = ps - c0 % ps;
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t pos = len - ql + i;
            // causal: positions <= this row's; a window keeps those > pos - window
            const int64_t from = window > 0 ? std::max(c0, pos - window + 1) : c0;
            const int64_t n = std::min(c1, pos + 1) - from;
            if (n <= 0) continue;
            const float* qv = q + ((cu[b] + i) * Hq + h * G) * D;  // this row's G heads, contiguous
            const int64_t k = (i - i0) * G, skip = (from - c0) * stride;
            if (fast) {
              fast(qv, K + skip, V + skip, stride, n, avail - (from - c0), D, sc, cap, st + k, A + k * D, scores);
            } else {
              chunk_generic(qv, G, K + skip, V + skip, stride, n, avail - (from - c0), D, sc, cap, st + k, A + k * D,
                            scores);
            }
          }
        }
        c0 = c1;
      }
    };
    // Threads take tasks one at a time from a shared counter: rows of unequal lengths make tasks of unequal
    // size, and on a shared machine a thread may stall; a task's result never depends on which thread runs it.
    std::atomic<int64_t> next{0};
    at::parallel_for(0, std::min<int64_t>(tasks, at::get_num_threads()), 1, [&](int64_t, int64_t) {
      std::vector<float> scores(G * kChunk), block_acc;
      std::vector<Partial> block_part;
      for (int64_t task; (task = next.fetch_add(1, std::memory_order_relaxed)) < tasks;) {
        const int64_t b = std::upper_bound(first_task.begin(), first_task.end(), task) - first_task.begin() - 1;
        const int64_t ql = cu[b + 1] - cu[b], t = task - first_task[b];
        if (ql <= kRows) {  // task (heads h0..h0 + heads_a_task, s), head h's slot first_acc[b] + h slices[b] + s
          const int64_t h0 = t / slices[b] * heads_a_task, s = t % slices[b], at = first_acc[b] + h0 * slices[b] + s;
          slice(b, h0, h0 + heads_a_task, slices[b] * nq, s, 0, ql, part.data() + at * nq, acc.data() + at * nq * D,
                scores.data());
          continue;
        }
        const int64_t blocks = (ql + kRows - 1) / kRows, h = t / blocks, i0 = (t % blocks) * kRows;
        const int64_t i1 = std::min(ql, i0 + kRows), nr = (i1 - i0) * G;
        block_part.resize(slices[b] * nr);
        block_acc.resize(slices[b] * nr * D);
        for (int64_t s = 0; s < slices[b]; ++s)
          slice(b, h, h + 1, 0, s, i0, i1, block_part.data() + s * nr, block_acc.data() + s * nr * D, scores.data());
        for (int64_t k = 0; k < nr; ++k)
          merge(b, i0 + k / G, h, k % G, block_part.data() + k, block_acc.data() + k * D, nr);
      }
    });
  };
  if (half_pools) {
    run((const uint16_t*)kp, (const uint16_t*)vp);
  } else {
    run((const float*)kp, (const float*)vp);
  }

  // the split sequences' slices, merged
  for (int64_t b = 0; b < B; ++b) {
    const int64_t ql = cu[b + 1] - cu[b];
    if (slices[b] == 0 || ql > kRows) continue;
    for (int64_t h = 0; h < Hkv; ++h) {
      const int64_t at = first_acc[b] + h * slices[b];
      for (int64_t k = 0; k < ql * G; ++k) merge(b, k / G, h, k % G, part.data() + at * nq + k, acc.data() + (at * nq + k) * D, nq);
    }
  }
  return {out, qrot};
}

TORCH_LIBRARY_FRAGMENT(pagedeck, lib) {
  lib.def("attend(Tensor qkv, Tensor(a!) k_pool, Tensor(b!) v_pool, Tensor cos, Tensor sin, Tensor slot_mapping, "
          "Tensor block_table, Tensor cu_q, Tensor kv_lens, int Hq, float scale, int max_q, Tensor? sinks=None, "
          "Tensor? q_norm=None, Tensor? k_norm=None, float norm_eps=0.0, int window=0, float softcap=0.0) "
          "-> (Tensor, Tensor)",
          &attend);
}

}  // namespace pagedeck
