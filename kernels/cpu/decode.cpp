// Every decoder layer of a decode-sized step in one call: RMSNorm, q|k|v, rotary + K/V write + attention, o,
// RMSNorm, gate|up with SwiGLU or GeGLU, down, for all layers, without going back to Python between the ~7
// kernels of a layer (at batch 1 that dispatch was ~1 ms of a ~9 ms step). The same kernel functions as the
// per-op path, called in the same order, so both paths give the same bits. A matrix made of parts in different
// formats (a Q4_K_M file's Q4_K q and k beside its Q6_K v, or a model's gate and up on its mapped file) is
// several (qs, d, m) triples, each part multiplied by its own kernel and the outputs joined, as
// engine.model.qlinear.PartsLinear does (SwiGLU then done apart by the epilogue's own function). A q|k|v bias (Qwen2) is
// added to the joined output as the per-op path adds it; per-head q/k norms (Qwen3, Gemma 3) go to the
// attention call as there. Gemma's layers: a norm after the attention's and the MLP's output (sandwich norms),
// GeGLU (the gate's tanh GELU times up, by the same ATen ops as the per-op path's), a sliding window per layer
// and the sliding layers' own rotary tables.
#include "common.h"
#include "ops.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

namespace pagedeck {
namespace {

// per layer: input_norm, post_norm, the q|k|v bias, q_norm, k_norm, the attention output's and the MLP output's
// norms (each empty: none), then (qs, d, m) of each part of kMatrices matrices: qkv, o, gate_up, down; beside
// them each part's format id (formats.h), in the same order
constexpr int64_t kMatrices = 4, kLayerTensors = 7;
enum Gate : int64_t { kSwiGLU = 1, kGeGLU = 2 };

// norm(x) * weight, where the layer has the norm (a non-empty weight)
at::Tensor norm_if(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return weight.numel() ? std::get<0>(rms_norm(x, weight, eps, c10::nullopt)) : x;
}

c10::optional<at::Tensor> given(const at::Tensor& t) {  // an empty tensor stands for none (q8 weights' minimums too)
  return t.numel() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

// x @ W^T for W given as `parts` (qs, d, m) triples from w on, of formats fmt[0..parts), stacked along the
// output (act only for one part)
at::Tensor project(const at::Tensor& x, const at::Tensor* w, const int64_t* fmt, int64_t parts, int64_t act) {
  if (parts == 1) return qmatmul(x, w[0], w[1], given(w[2]), fmt[0], act);
  std::vector<at::Tensor> ys;
  for (int64_t i = 0; i < parts; ++i)
    ys.push_back(qmatmul(x, w[3 * i], w[3 * i + 1], given(w[3 * i + 2]), fmt[i], 0));
  return at::cat(ys, 1);
}

std::tuple<at::Tensor, at::Tensor> decode_layers(const at::Tensor& x0, at::TensorList weights, at::TensorList k_pools,
                                                 at::TensorList v_pools, const at::Tensor& cos, const at::Tensor& sin,
                                                 const at::Tensor& sliding_cos, const at::Tensor& sliding_sin,
                                                 const at::Tensor& slot_mapping, const at::Tensor& block_table,
                                                 const at::Tensor& cu_q, const at::Tensor& kv_lens,
                                                 at::IntArrayRef parts, at::IntArrayRef fmts, at::IntArrayRef windows,
                                                 at::IntArrayRef sliding, int64_t Hq, double scale, double eps,
                                                 int64_t gate, double softcap, int64_t max_q) {
  const int64_t L = (int64_t)k_pools.size();
  TORCH_CHECK(L > 0 && (int64_t)parts.size() == L * kMatrices && (int64_t)v_pools.size() == L,
              "decode_layers wants ", kMatrices, " part counts and a K and V pool per layer");
  TORCH_CHECK((int64_t)windows.size() == L && (int64_t)sliding.size() == L,
              "decode_layers wants a window and a rotary choice per layer");
  TORCH_CHECK(gate == kSwiGLU || gate == kGeGLU, "decode_layers' gate is 1 (SwiGLU) or 2 (GeGLU), got ", gate);
  int64_t total = 0;
  for (int64_t i = 0; i < L * kMatrices; ++i) {
    TORCH_CHECK(parts[i] >= 1, "decode_layers wants at least one part a matrix");
    total += 3 * parts[i];
  }
  TORCH_CHECK((int64_t)weights.size() == total + kLayerTensors * L,
              "decode_layers' weights do not match the part counts");
  TORCH_CHECK((int64_t)fmts.size() * 3 == total, "decode_layers wants one format id per part");
  TORCH_CHECK(cu_q.scalar_type() == at::kInt && cu_q.is_contiguous(), "cu_q must be contiguous int32");
  const int32_t* cu = cu_q.data_ptr<int32_t>();
  for (int64_t b = 0; b + 1 < cu_q.numel(); ++b)
    TORCH_CHECK(cu[b + 1] - cu[b] <= max_q, "decode_layers runs short query chunks only (<= ", max_q, " rows)");
  at::Tensor x = x0;
  c10::optional<at::Tensor> residual;
  const at::Tensor* w = weights.data();
  const int64_t* fmt = fmts.data();
  for (int64_t l = 0; l < L; ++l) {
    const int64_t* n = parts.data() + l * kMatrices;
    const at::Tensor *qkv_w = w + kLayerTensors, *o_w = qkv_w + 3 * n[0];
    const at::Tensor *gate_up_w = o_w + 3 * n[1], *down_w = gate_up_w + 3 * n[2];
    const int64_t *qkv_f = fmt, *o_f = qkv_f + n[0], *gate_up_f = o_f + n[1], *down_f = gate_up_f + n[2];
    auto [h, sum] = rms_norm(x, w[0], eps, residual);
    at::Tensor qkv = project(h, qkv_w, qkv_f, n[0], 0);
    if (w[2].numel()) qkv = qkv + w[2];
    const bool own_rope = sliding[l] != 0;
    auto [o, q] = attend(qkv, k_pools[l], v_pools[l], own_rope ? sliding_cos : cos, own_rope ? sliding_sin : sin,
                         slot_mapping, block_table, cu_q, kv_lens, Hq, scale, max_q, c10::nullopt, given(w[3]),
                         given(w[4]), eps, windows[l], softcap);
    x = norm_if(project(o, o_w, o_f, n[1], 0), w[5], eps);
    auto [h2, sum2] = rms_norm(x, w[1], eps, sum);
    residual = sum2;
    at::Tensor a;
    if (gate == kSwiGLU) {  // the epilogue, or for parts (a model still on its mapped file) the same one apart
      a = n[2] == 1 ? project(h2, gate_up_w, gate_up_f, 1, 1) : silu_mul_op(project(h2, gate_up_w, gate_up_f, n[2], 0));
    } else {  // kernels/reference.py's gelu_tanh_mul, op for op
      const at::Tensor gu = project(h2, gate_up_w, gate_up_f, n[2], 0);
      const int64_t I = gu.size(1) / 2;
      a = at::gelu(gu.narrow(1, 0, I), "tanh") * gu.narrow(1, I, I);
    }
    x = norm_if(project(a, down_w, down_f, n[3], 0), w[6], eps);
    w = down_w + 3 * n[3];
    fmt = down_f + n[3];
  }
  return {x, *residual};
}

// How many threads the kernels' parallel loops really run on (at::parallel_for is OpenMP inlined from torch's
// headers: a build without -fopenmp runs every loop on one thread whatever torch.set_num_threads says).
int64_t parallel_threads() {
  std::vector<int> seen(at::get_num_threads(), 0);
  at::parallel_for(0, 1024, 1, [&](int64_t, int64_t) { seen[at::get_thread_num()] = 1; });
  int64_t n = 0;
  for (int v : seen) n += v;
  return n;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pagedeck, lib) {
  lib.def("parallel_threads() -> int", &parallel_threads);
  lib.def("decode_layers(Tensor x, Tensor[] weights, Tensor(a!)[] k_pools, Tensor(b!)[] v_pools, Tensor cos, "
          "Tensor sin, Tensor sliding_cos, Tensor sliding_sin, Tensor slot_mapping, Tensor block_table, Tensor cu_q, "
          "Tensor kv_lens, int[] parts, int[] formats, int[] windows, int[] sliding, int Hq, "
          "float scale, float eps, int gate, float softcap, int max_q) -> (Tensor, Tensor)",
          &decode_layers);
}

}  // namespace pagedeck
