// The CPU kernels' entry points, for one another (decode.cpp chains them without going back to Python).
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace pagedeck {

// y = x @ W^T for a packed W (qmatmul.cpp) of format id fmt (formats.h); m: q4's and q5's minimums, absent for
// the others; act: 0 none, 1 SwiGLU
at::Tensor qmatmul(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, const c10::optional<at::Tensor>& m,
                   int64_t fmt, int64_t act);

// rotary + K/V write + attention of the short query chunks (attention.cpp); returns (out, rotated q); sinks:
// (Hq,) float32 logits added to each head's softmax denominator (gpt-oss), or none; q_norm / k_norm: (D,)
// per-head RMSNorm weights applied before the rotation (norm_eps); window: a sliding window (0 none);
// softcap: scores' soft cap (0 none); cos/sin (T, r / 2) rotate each head's first r dims
std::tuple<at::Tensor, at::Tensor> attend(const at::Tensor& qkv, const at::Tensor& k_pool, const at::Tensor& v_pool,
                                          const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slot_mapping,
                                          const at::Tensor& block_table, const at::Tensor& cu_q,
                                          const at::Tensor& kv_lens, int64_t Hq, double scale, int64_t max_q,
                                          const c10::optional<at::Tensor>& sinks = c10::nullopt,
                                          const c10::optional<at::Tensor>& q_norm = c10::nullopt,
                                          const c10::optional<at::Tensor>& k_norm = c10::nullopt, double norm_eps = 0.0,
                                          int64_t window = 0, double softcap = 0.0);

// silu(gate) * up of gate_up (rows, 2 I) = [gate | up] -> (rows, I), the matmul's SwiGLU epilogue done apart
// (qmatmul.cpp): for a [gate | up] held in parts, whose rows then match the fused matrix's
at::Tensor silu_mul_op(const at::Tensor& gate_up);

// (norm(x + residual) * weight, x + residual) (norm.cpp)
std::tuple<at::Tensor, at::Tensor> rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                                            const c10::optional<at::Tensor>& residual);

// One sparse layer's experts: each row's top-k experts' [gate | up] -> SwiGLU (act 1) -> down, weighted and
// summed (moe.cpp; its MoEExperts holds the layer's packed experts)
struct MoEExperts;
at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& experts, const at::Tensor& weights,
                       const MoEExperts& table, int64_t act);

// x (T, K) @ router (E, K)^T (+ bias): a sparse layer's router logits, each in one fixed order (moe.cpp)
at::Tensor router_logits(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias);

}  // namespace pagedeck
