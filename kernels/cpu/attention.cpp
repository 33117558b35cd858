// One call per layer for decode-sized steps: rotary on q and k, K/V written into the paged pools, and
// causal attention of each sequence's few query rows over its pages (fp32 pools).
//
// Token i of sequence b sits at position kv_lens[b] - q_len_b + i and attends to positions 0..that one
// (decode, speculative verification). Sequences with more than max_q query rows (prefill chunks) are only
// rotated and written: the caller runs torch's SDPA for them on the returned rotated q. Work is split into
// (sequence, kv head, context slice) tasks with an online softmax each, merged by log-sum-exp, so a long
// context also spreads over the threads. Slices depend on the sequence's own length only, so a sequence's
// result never depends on what else is in the batch. GQA: a KV head's G query heads run in one task.
#include "common.h"
#include "ops.h"

#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <limits>
#include <vector>

namespace pagedeck {
namespace {

constexpr int64_t kChunk = 64;     // positions scored at once
constexpr int64_t kSlice = 512;     // context positions per task

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

inline float dot(const float* a, const float* b, int64_t D) {
  int64_t i = 0;
  float r = 0.0f;
#ifdef PD_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= D; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  r = hsum(acc);
#endif
  for (; i < D; ++i) r += a[i] * b[i];
  return r;
}

inline void axpy(float p, const float* v, float* acc, int64_t D) {
  int64_t i = 0;
#ifdef PD_AVX2
  const __m256 pv = _mm256_set1_ps(p);
  for (; i + 8 <= D; i += 8) _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + i)));
#endif
  for (; i < D; ++i) acc[i] += p * v[i];
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

}  // namespace

std::tuple<at::Tensor, at::Tensor> attend(const at::Tensor& qkv, const at::Tensor& k_pool, const at::Tensor& v_pool,
                                          const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slot_mapping,
                                          const at::Tensor& block_table, const at::Tensor& cu_q,
                                          const at::Tensor& kv_lens, int64_t Hq, double scale, int64_t max_q) {
  check_cpu_f32(qkv, "qkv");
  check_cpu_f32(k_pool, "k_pool");
  check_cpu_f32(v_pool, "v_pool");
  check_cpu_f32(cos, "cos");
  check_cpu_f32(sin, "sin");
  TORCH_CHECK(k_pool.dim() == 4 && k_pool.sizes() == v_pool.sizes(), "pools must be (pages, page_size, Hkv, D)");
  const int64_t P = k_pool.size(0), ps = k_pool.size(1), Hkv = k_pool.size(2), D = k_pool.size(3);
  const int64_t T = qkv.size(0), half = D / 2, G = Hq / Hkv;
  TORCH_CHECK(Hq % Hkv == 0 && D % 2 == 0 && qkv.dim() == 2 && qkv.size(1) == (Hq + 2 * Hkv) * D,
              "qkv does not match the pools' heads");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.size(0) == T && cos.size(1) == half, "bad rotary tables");
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
    if (ql <= max_q) qmax = std::max(qmax, ql);
  }
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(slots[t] >= 0 && slots[t] < P * ps, "slot_mapping outside the pool");

  // rotary on q (into a buffer) and k, k and v into their slots
  const float* x = qkv.data_ptr<float>();
  const float* cs = cos.data_ptr<float>();
  const float* sn = sin.data_ptr<float>();
  float* kp = k_pool.data_ptr<float>();
  float* vp = v_pool.data_ptr<float>();
  at::Tensor qrot = at::empty({T, Hq, D}, qkv.options());
  float* q = qrot.data_ptr<float>();
  const int64_t row = (Hq + 2 * Hkv) * D;
  for (int64_t t = 0; t < T; ++t) {
    const float* r = x + t * row;
    for (int64_t h = 0; h < Hq; ++h) rotate(r + h * D, cs + t * half, sn + t * half, half, q + (t * Hq + h) * D);
    for (int64_t h = 0; h < Hkv; ++h) {
      rotate(r + (Hq + h) * D, cs + t * half, sn + t * half, half, kp + (slots[t] * Hkv + h) * D);
      std::memcpy(vp + (slots[t] * Hkv + h) * D, r + (Hq + Hkv + h) * D, D * sizeof(float));
    }
  }

  // tasks: (sequence, kv head, slice of kSlice positions); none for sequences left to the caller
  std::vector<int64_t> first_task(B + 1, 0), slices(B);
  for (int64_t b = 0; b < B; ++b) {
    slices[b] = cu[b + 1] - cu[b] <= max_q ? (lens[b] + kSlice - 1) / kSlice : 0;
    first_task[b + 1] = first_task[b] + Hkv * slices[b];
  }
  const int64_t tasks = first_task[B], nq = qmax * G;
  std::vector<float> acc(tasks * nq * D);
  std::vector<Partial> part(tasks * nq);
  const float sc = (float)scale;
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(kChunk);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = std::upper_bound(first_task.begin(), first_task.end(), task) - first_task.begin() - 1;
      const int64_t h = (task - first_task[b]) / slices[b], s = (task - first_task[b]) % slices[b];
      const int64_t len = lens[b], ql = cu[b + 1] - cu[b];
      const int64_t per = (len + slices[b] - 1) / slices[b];
      const int64_t lo = s * per, hi = std::min(len, lo + per);
      float* A = acc.data() + task * nq * D;
      Partial* st = part.data() + task * nq;
      std::fill(A, A + ql * G * D, 0.0f);
      for (int64_t j = 0; j < ql * G; ++j) st[j] = {-std::numeric_limits<float>::infinity(), 0.0f};
      for (int64_t c0 = lo; c0 < hi;) {  // chunks never cross a page
        const int64_t page = table[b * W + c0 / ps];
        const int64_t c1 = std::min({hi, c0 + kChunk, (c0 / ps + 1) * ps});
        const float* K = kp + ((page * ps + c0 % ps) * Hkv + h) * D;
        const float* V = vp + ((page * ps + c0 % ps) * Hkv + h) * D;
        const int64_t stride = Hkv * D;
        for (int64_t i = 0; i < ql; ++i) {
          const int64_t n = std::min(c1, len - ql + i + 1) - c0;  // causal: positions <= this row's
          if (n <= 0) continue;
          for (int64_t g = 0; g < G; ++g) {
            const float* qv = q + ((cu[b] + i) * Hq + h * G + g) * D;
            float mx = -std::numeric_limits<float>::infinity();
            for (int64_t p = 0; p < n; ++p) {
              scores[p] = sc * dot(qv, K + p * stride, D);
              mx = std::max(mx, scores[p]);
            }
            Partial& ps_ = st[i * G + g];
            float* a = A + (i * G + g) * D;
            const float m_new = std::max(ps_.max, mx);
            if (ps_.max != m_new && ps_.sum > 0.0f) {
              const float alpha = std::exp(ps_.max - m_new);
              for (int64_t d = 0; d < D; ++d) a[d] *= alpha;
              ps_.sum *= alpha;
            }
            ps_.max = m_new;
            ps_.sum += exp_sum(scores.data(), n, m_new);
            for (int64_t p = 0; p < n; ++p) axpy(scores[p], V + p * stride, a, D);
          }
        }
        c0 = c1;
      }
    }
  });

  // merge slices: o = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s
  at::Tensor out = at::empty({T, Hq * D}, qkv.options());
  float* o = out.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t ql = cu[b + 1] - cu[b];
    if (slices[b] == 0) continue;
    for (int64_t h = 0; h < Hkv; ++h) {
      const int64_t base = first_task[b] + h * slices[b];
      for (int64_t j = 0; j < ql * G; ++j) {
        float M = -std::numeric_limits<float>::infinity();
        for (int64_t s = 0; s < slices[b]; ++s) M = std::max(M, part[(base + s) * nq + j].max);
        float* dst = o + (cu[b] + j / G) * Hq * D + (h * G + j % G) * D;
        std::fill(dst, dst + D, 0.0f);
        float total = 0.0f;
        for (int64_t s = 0; s < slices[b]; ++s) {
          const Partial& p = part[(base + s) * nq + j];
          if (p.sum == 0.0f) continue;
          const float w = slices[b] == 1 ? 1.0f : std::exp(p.max - M);
          total += w * p.sum;
          axpy(w, acc.data() + ((base + s) * nq + j) * D, dst, D);
        }
        const float inv = 1.0f / total;
        for (int64_t d = 0; d < D; ++d) dst[d] *= inv;
      }
    }
  }
  return {out, qrot};
}

TORCH_LIBRARY_FRAGMENT(pagedeck, lib) {
  lib.def("attend(Tensor qkv, Tensor(a!) k_pool, Tensor(b!) v_pool, Tensor cos, Tensor sin, Tensor slot_mapping, "
          "Tensor block_table, Tensor cu_q, Tensor kv_lens, int Hq, float scale, int max_q) -> (Tensor, Tensor)",
          &attend);
}

}  // namespace pagedeck
