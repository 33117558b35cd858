// One sparse layer's experts in one call: each row's top-k experts' [gate | up] -> SwiGLU -> down, summed with
// the router's weights (engine.model.moe_kernel). gpt-oss's experts add a bias to gate|up's and down's outputs
// and take the clamped SwiGLU (activations.h) instead: act 2, the limit and alpha held with the experts.
//
// The experts stay in their own packed formats (formats.h: a Q4_K_M file's Q4_K gate|up beside its Q4_K or Q6_K
// down, q4, q5, q8, gpt-oss's mxfp4, iq4nl/iq4xs ...) and are multiplied by the per-format row kernels that
// qmatmul's per-row path runs, reached through the same dispatch (dispatch.h: with_format, weight_row). The
// threads share one list of (expert, chunk of output rows) tasks of about equal weight bytes, handed out from
// a shared counter: every expert that any row chose is read once a step, by whichever threads take its
// chunks, and all of its rows meet each weight row while it is in cache.
// llama.cpp's mul_mat_id groups the rows by expert the same way (matrix_row_counts) but runs gate, up, the
// activation and down as four graph ops with a barrier between each, and splits one expert's rows among the
// threads at a time; here gate and up of a chunk share one task, SwiGLU is its epilogue, and the threads move
// from expert to expert without waiting: a step has two barriers (after gate|up, after down) whatever k is.
//
// A call goes in four phases:
//   1. x is quantized once per activation kind its gate|up formats need (dispatch.h's row_acts: per 32 for q4,
//      q5, q8 and the lut4 family; per 256, Q8_K, for q4k, q5k and q6), and each expert's rows are gathered
//      from it;
//   2. gate|up tasks: gate rows and up rows of a chunk (plus their biases), the activation into the expert's
//      rows of A;
//   3. each expert's A rows quantized for its down's format, then down tasks into the expert's rows of Y (plus
//      down's bias: the torch path's linear(a, down, bias), a product then one add);
//   4. out[r] = sum over r's experts in ascending expert order of Y[slot] * weight, a product then a sum (never
//      fused into an fma): the torch path's index_add_ of y * scale, expert by expert, in the same order.
// An expert that enough rows chose (kWholeCallRows; prompt chunks) takes qmatmul instead, after the others: its
// own GEMM tiles or row chunks over all threads. Every element is the arithmetic qmatmul does for it, whatever
// the rows, tasks or threads, so a row's output equals the torch path's (engine.model.moe) bit for bit and
// never depends on the rest of the batch.
#include "activations.h"
#include "common.h"
#include "dispatch.h"
#include "formats.h"
#include "ops.h"

#include <ATen/ATen.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <vector>

namespace pagedeck {

// One packed matrix of an expert: its tensors (kept alive here) and the pointers the row kernels read.
struct ExpertMatrix {
  at::Tensor qs, d;
  c10::optional<at::Tensor> m;
  formats::Format f;
  rows::Weights w;
  int64_t N, row_bytes;
};

// A layer's experts, built once per layer (engine.model.moe_kernel) so a call passes one object, not 6 tensors
// an expert: per expert e, blocks[6e .. 6e+3) is gate|up's (qs, d, m) and blocks[6e+3 .. 6e+6) down's, m an
// empty tensor where the format has none; formats[2e], formats[2e+1] their kernel ids (formats.h); biases
// none, or per expert gate|up's (2 inter,) and down's (hidden,) fp32 biases, biases[2e] and biases[2e + 1];
// limit and alpha the clamped SwiGLU's (act 2).
struct MoEExperts : torch::CustomClassHolder {
  std::vector<ExpertMatrix> gate_up, down;
  std::vector<at::Tensor> gate_up_bias, down_bias;  // empty, or one per expert
  int64_t hidden = 0, inter = 0;
  float limit = 0.0f, alpha = 1.0f;

  MoEExperts(std::vector<at::Tensor> blocks, std::vector<int64_t> fmts, std::vector<at::Tensor> biases,
             double swiglu_limit, double swiglu_alpha)
      : limit((float)swiglu_limit), alpha((float)swiglu_alpha) {
    const int64_t E = (int64_t)fmts.size() / 2;
    TORCH_CHECK(E > 0 && (int64_t)fmts.size() == 2 * E && (int64_t)blocks.size() == 6 * E,
                "MoEExperts wants (qs, d, m) of gate|up and down and their two format ids per expert, got ",
                blocks.size(), " tensors and ", fmts.size(), " ids");
    for (int64_t e = 0; e < E; ++e) {
      gate_up.push_back(matrix(blocks.data() + 6 * e, fmts[2 * e]));
      down.push_back(matrix(blocks.data() + 6 * e + 3, fmts[2 * e + 1]));
      const ExpertMatrix &g = gate_up.back(), &dn = down.back();
      if (e == 0) hidden = g.w.K, inter = g.N / 2;
      TORCH_CHECK(g.w.K == hidden && g.N == 2 * inter && dn.w.K == inter && dn.N == hidden, "expert ", e,
                  ": gate|up (", g.N, ", ", g.w.K, ") and down (", dn.N, ", ", dn.w.K,
                  ") do not match the first expert's (", 2 * inter, ", ", hidden, ") and (", hidden, ", ", inter, ")");
    }
    TORCH_CHECK(biases.empty() || (int64_t)biases.size() == 2 * E, "MoEExperts wants no biases or two an expert, got ",
                biases.size(), " for ", E, " experts");
    for (size_t i = 0; i < biases.size(); ++i) {
      const int64_t n = i % 2 ? hidden : 2 * inter;
      check_cpu_f32(biases[i], "an expert's bias");
      TORCH_CHECK(biases[i].dim() == 1 && biases[i].size(0) == n, "expert ", i / 2, "'s ", i % 2 ? "down" : "gate|up",
                  " bias must be (", n, "), got ", biases[i].sizes());
      (i % 2 ? down_bias : gate_up_bias).push_back(biases[i]);
    }
  }

  bool biased() const { return !gate_up_bias.empty(); }
  const float* gate_up_bias_of(int64_t e) const { return biased() ? gate_up_bias[e].data_ptr<float>() : nullptr; }
  const float* down_bias_of(int64_t e) const { return biased() ? down_bias[e].data_ptr<float>() : nullptr; }

  // A matrix's tensors, checked against its declared format by qmatmul itself (a call of no rows checks
  // every layout rule and returns at once).
  static ExpertMatrix matrix(const at::Tensor* t, int64_t fmt) {
    TORCH_CHECK(fmt >= 0 && fmt < formats::kCount, "unknown packed format id ", fmt, " (kernels/formats.py)");
    const formats::Layout& L = formats::kLayouts[fmt];
    TORCH_CHECK(t[0].dim() == 2 && t[0].scalar_type() == at::kByte, "an expert's qs must be 2-D uint8");
    TORCH_CHECK(t[0].size(1) % (L.code_bytes * L.rows) == 0, "packed weights do not match their declared format ",
                L.name, " (id ", fmt, "): rows of ", t[0].size(1), " bytes are not whole blocks of ",
                L.code_bytes * L.rows, " bytes");
    const int64_t K = t[0].size(1) * L.values / (L.code_bytes * L.rows), N = t[0].size(0) * L.rows;
    c10::optional<at::Tensor> m = t[2].numel() ? c10::optional<at::Tensor>(t[2]) : c10::nullopt;
    qmatmul(at::empty({0, K}, at::kFloat), t[0], t[1], m, fmt, 0);
    const bool affine = L.scales == 2;
    rows::Weights w{(const uint8_t*)t[0].data_ptr(), L.scales == 0 ? nullptr : (const uint16_t*)t[1].data_ptr(),
                    affine ? (const uint16_t*)m->data_ptr() : nullptr, K, K / kBlock};
    return {t[0], t[1], m, (formats::Format)fmt, w, N, t[0].numel() / N};
  }
};

namespace {

using namespace formats;  // Format and its ids

// kernels.packed.ACTIVATIONS' ids, and gpt-oss's clamped SwiGLU (engine.model.moe_kernel.CLAMPED_SWIGLU)
enum Act : int64_t { kSwiGLU = 1, kClampedSwiGLU = 2 };

// An expert with this many rows or more takes whole qmatmul calls: enough rows for its GEMM tiles (or its own
// row chunks over all threads) to beat sharing the per-row tasks.
constexpr int64_t kWholeCallRows = 8;
// Weight bytes a task: a quarter of a thread's share of the step, within these bounds (qmatmul's row chunks:
// long runs keep each thread's stream sequential; several tasks a thread let the threads finish together).
constexpr int64_t kMinTaskBytes = 64 << 10, kMaxTaskBytes = 512 << 10;
// Up to these many experts (quantizing their A rows) or rows (the weighted sums) the calling thread does the
// small steps alone: a decode step then wakes the threads twice (gate|up, down), each wake-up a wait for
// every thread where the machine is shared.
constexpr int64_t kSerialExperts = 64, kSerialRows = 32;

// The activations a format's row kernel reads (dispatch.h's row_acts): activations of one kind serve every
// format of that kind, so x is quantized once per kind.
using Kind = RowActs;
constexpr int kKinds = kRowActKinds;

Kind kind_of(Format f) { return row_acts(f); }

void quantize(const float* x, int64_t M, int64_t K, Kind kind, QuantAct& a) {
  if (kind == Kind::kPer256) {
    quantize_k(x, M, K, a.k);
  } else {
    quantize_rows(x, M, K, a, kind == Kind::kPaired);
  }
}

// dst = rows `rows[0..M)` of src (both quantized as `kind`, K values a row)
void gather(const QuantAct& src, const int64_t* rows, int64_t M, int64_t K, Kind kind, QuantAct& dst) {
  auto take = [&](const auto& from, auto& to, int64_t width) {
    to.resize(M * width);
    for (int64_t m = 0; m < M; ++m) std::copy_n(from.data() + rows[m] * width, width, to.data() + m * width);
  };
  if (kind == Kind::kPer256) {
    dst.k.nsb = src.k.nsb;
    take(src.k.q, dst.k.q, K);
    take(src.k.d, dst.k.d, src.k.nsb);
    take(src.k.bs, dst.k.bs, src.k.nsb * 8);
    take(src.k.hs, dst.k.hs, src.k.nsb * 16);
    return;
  }
  const int64_t nbp = src.nbp;
  dst.nbp = nbp;
  take(src.q, dst.q, K);
  take(src.d, dst.d, nbp);
  take(src.s, dst.s, nbp);
  take(src.c, dst.c, nbp);
  take(src.isum, dst.isum, nbp);
}

// out[m * ldo + n - n0] = weight row n . activation row m for rows [n0, n1) (whole groups for the grouped formats) and all M
// activation rows: the row kernels qmatmul's per-row path calls (dispatch.h), each weight row met by every
// activation row.
void products(const ExpertMatrix& mat, const QuantAct& a, int64_t M, int64_t n0, int64_t n1, float* out, int64_t ldo) {
  with_format(mat.f, [&](auto format) {
    constexpr int F = decltype(format)::value;
    thread_local std::vector<float> col;
    if constexpr (grouped_rows(F)) {
      constexpr int64_t kRows = formats::kLayouts[F].rows;
      col.resize(M * kRows);
      for (int64_t n = n0; n < n1; n += kRows) {
        group_rows<F>(mat.w, a, M, n / kRows, col.data());
        for (int64_t m = 0; m < M; ++m) std::copy_n(col.data() + m * kRows, kRows, out + m * ldo + n - n0);
      }
    } else if constexpr (has_row_kernel(F)) {
      col.resize(M);
      for (int64_t n = n0; n < n1; ++n) {
        weight_row<F>(mat.w, a, M, n, col.data());
        for (int64_t m = 0; m < M; ++m) out[m * ldo + n - n0] = col[m];
      }
    } else {
      TORCH_CHECK(false, "no per-row kernel for packed format id ", F);
    }
  });
}

// acc[m * ld + j] += bias[j] for M rows of n values: the torch path's y + bias, one rounding an element
void add_bias(float* acc, int64_t ld, const float* bias, int64_t M, int64_t n) {
  if (bias == nullptr) return;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < n; ++j) acc[m * ld + j] += bias[j];
}

// The activations of a call: x quantized per kind, and per active expert its gathered x rows and its A rows.
struct Scratch {
  QuantAct x[kKinds];
  std::vector<QuantAct> xa, aa;
};

// A task: output rows [n0, n1) of the `expert`-th active expert's gate|up (SwiGLU rows: gate rows and up rows) or down.
struct Task {
  int64_t expert, n0, n1;
};

// Chunks of about `target` weight bytes (whole groups for the grouped formats) over an expert's Nout output rows.
void add_tasks(int64_t expert, const ExpertMatrix& mat, int64_t Nout, int64_t bytes_a_row, int64_t target,
               std::vector<Task>& tasks) {
  const int64_t unit = formats::kLayouts[mat.f].rows, units = Nout / unit;
  const int64_t chunks = std::max<int64_t>(1, std::min(units, (Nout * bytes_a_row + target - 1) / target));
  for (int64_t c = 0; c < chunks; ++c)
    tasks.push_back({expert, units * c / chunks * unit, units * (c + 1) / chunks * unit});
}

// fn(task) for every task, the threads taking them in order from a shared counter
template <class Fn>
void run_tasks(const std::vector<Task>& tasks, Fn&& fn) {
  const int64_t n = (int64_t)tasks.size();
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), n), 1, [&](int64_t, int64_t) {
    for (int64_t t = next.fetch_add(1, std::memory_order_relaxed); t < n; t = next.fetch_add(1, std::memory_order_relaxed))
      fn(tasks[t]);
  });
}

// acc[i] = acc[i] + y[i] * w, rounded after the product and after the sum as torch's mul then index_add_ are
// (no fma: with contraction the kernel would no longer give the torch path's bits)
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
void add_scaled(float* acc, const float* y, float w, int64_t n) {
#ifdef __clang__
#pragma clang fp contract(off)
#endif
  for (int64_t i = 0; i < n; ++i) {
    const float p = y[i] * w;
    acc[i] = acc[i] + p;
  }
}

}  // namespace

at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& experts, const at::Tensor& weights,
                       const MoEExperts& table, int64_t act) {
  check_cpu_f32(x, "x");
  check_cpu_f32(weights, "weights");
  TORCH_CHECK(act == kSwiGLU || act == kClampedSwiGLU, "moe_experts: unknown activation id ", act,
              " (1: SwiGLU, 2: clamped SwiGLU)");
  // the torch path adds biases only before the clamped SwiGLU (gpt-oss); the plain one is qmatmul's epilogue
  TORCH_CHECK(act == kClampedSwiGLU || !table.biased(), "moe_experts: biased experts take the clamped SwiGLU (2)");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == table.hidden, "x must be (rows, ", table.hidden, "), got ", x.sizes());
  TORCH_CHECK(experts.scalar_type() == at::kLong && experts.is_contiguous() && experts.dim() == 2 &&
                  experts.size(0) == x.size(0) && weights.sizes() == experts.sizes(),
              "experts must be contiguous int64 (rows, k) and weights float32 of the same shape");
  const int64_t T = x.size(0), k = experts.size(1), H = table.hidden, I = table.inter;
  const int64_t E = (int64_t)table.gate_up.size(), S = T * k;
  at::Tensor out = at::zeros({T, H}, x.options());
  if (S == 0) return out;
  const int64_t* choice = experts.data_ptr<int64_t>();
  const float* weight = weights.data_ptr<float>();

  // The choices grouped by expert, rows ascending within each (the torch path's stable argsort): expert e's
  // rows are slots [first[e], first[e + 1]) of A and Y.
  std::vector<int64_t> first(E + 1, 0), slot_of(S), row_of(S);
  for (int64_t i = 0; i < S; ++i) {
    TORCH_CHECK(choice[i] >= 0 && choice[i] < E, "expert id ", choice[i], " out of range (", E, " experts)");
    ++first[choice[i] + 1];
  }
  for (int64_t e = 0; e < E; ++e) first[e + 1] += first[e];
  {
    std::vector<int64_t> fill(first.begin(), first.end() - 1);
    for (int64_t i = 0; i < S; ++i) {
      const int64_t s = fill[choice[i]]++;
      slot_of[i] = s;
      row_of[s] = i / k;
    }
  }
  std::vector<int64_t> active, whole;  // experts of this step: through the shared tasks, or whole qmatmul calls
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = first[e + 1] - first[e];
    if (n == 0) continue;
    const bool rows_kernel = has_row_kernel(table.gate_up[e].f) && has_row_kernel(table.down[e].f);
    (n >= kWholeCallRows || !rows_kernel ? whole : active).push_back(e);
  }
  at::Tensor Y = at::empty({S, H}, x.options());
  float* y = Y.data_ptr<float>();
  // g = act(g, u) for n values of a row's gate and up
  auto activate = [&](float* g, const float* u, int64_t n) {
    if (act == kSwiGLU) {
      silu_mul(g, u, n);
    } else {
      clamped_swiglu(g, u, n, table.limit, table.alpha);
    }
  };

  if (!active.empty()) {
    const int64_t threads = at::get_num_threads(), n_active = (int64_t)active.size();
    int64_t gate_up_bytes = 0, down_bytes = 0;
    bool kinds[kKinds] = {};
    for (int64_t e : active) {
      gate_up_bytes += table.gate_up[e].N * table.gate_up[e].row_bytes;
      down_bytes += table.down[e].N * table.down[e].row_bytes;
      kinds[(int)kind_of(table.gate_up[e].f)] = true;
    }
    auto target = [&](int64_t bytes) { return std::clamp(bytes / (4 * threads), kMinTaskBytes, kMaxTaskBytes); };
    // 1. x quantized once per kind; each active expert's rows gathered from it (one expert a task)
    // the calling thread's buffers, kept between calls (named through references: inside the tasks' lambdas a
    // thread_local's own name would be each worker's instance)
    static thread_local Scratch kept;
    QuantAct* quantized = kept.x;
    std::vector<QuantAct>&xa = kept.xa, &aa = kept.aa;
    if ((int64_t)xa.size() < n_active) xa.resize(n_active), aa.resize(n_active);
    for (int kind = 0; kind < kKinds; ++kind)
      if (kinds[kind]) quantize(x.data_ptr<float>(), T, H, (Kind)kind, quantized[kind]);
    for (int64_t i = 0; i < n_active; ++i) {  // copies of a few KB a row: not worth waking the threads
      const int64_t e = active[i];
      const Kind kind = kind_of(table.gate_up[e].f);
      gather(quantized[(int)kind], row_of.data() + first[e], first[e + 1] - first[e], H, kind, xa[i]);
    }
    // 2. gate|up: a task's gate rows, then its up rows (each its own sequential stream), the activation into A
    at::Tensor A = at::empty({S, I}, x.options());
    float* a_rows = A.data_ptr<float>();
    std::vector<Task> tasks;
    for (int64_t i = 0; i < n_active; ++i) {
      const ExpertMatrix& g = table.gate_up[active[i]];
      add_tasks(i, g, I, 2 * g.row_bytes, target(gate_up_bytes), tasks);
    }
    run_tasks(tasks, [&](const Task& t) {
      thread_local std::vector<float> gate, up;
      const int64_t e = active[t.expert], M = first[e + 1] - first[e], len = t.n1 - t.n0;
      gate.resize(M * len);
      up.resize(M * len);
      products(table.gate_up[e], xa[t.expert], M, t.n0, t.n1, gate.data(), len);
      products(table.gate_up[e], xa[t.expert], M, t.n0 + I, t.n1 + I, up.data(), len);
      if (const float* bias = table.gate_up_bias_of(e)) {
        add_bias(gate.data(), len, bias + t.n0, M, len);
        add_bias(up.data(), len, bias + I + t.n0, M, len);
      }
      for (int64_t m = 0; m < M; ++m) {
        activate(gate.data() + m * len, up.data() + m * len, len);
        std::copy_n(gate.data() + m * len, len, a_rows + (first[e] + m) * I + t.n0);
      }
    });
    // 3. A quantized for each expert's down, then down tasks straight into the expert's rows of Y
    at::parallel_for(0, n_active, kSerialExperts, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t e = active[i];
        quantize(a_rows + first[e] * I, first[e + 1] - first[e], I, kind_of(table.down[e].f), aa[i]);
      }
    });
    tasks.clear();
    for (int64_t i = 0; i < n_active; ++i) {
      const ExpertMatrix& d = table.down[active[i]];
      add_tasks(i, d, H, d.row_bytes, target(down_bytes), tasks);
    }
    run_tasks(tasks, [&](const Task& t) {
      const int64_t e = active[t.expert], M = first[e + 1] - first[e];
      products(table.down[e], aa[t.expert], M, t.n0, t.n1, y + first[e] * H + t.n0, H);
      if (const float* bias = table.down_bias_of(e))
        add_bias(y + first[e] * H + t.n0, H, bias + t.n0, M, t.n1 - t.n0);
    });
  }
  // Experts of many rows: qmatmul over all threads each (its GEMM tiles for prompt chunks)
  for (int64_t e : whole) {
    const at::Tensor rows = at::from_blob(row_of.data() + first[e], {first[e + 1] - first[e]}, at::kLong);
    const ExpertMatrix &g = table.gate_up[e], &d = table.down[e];
    const at::Tensor xs = x.index_select(0, rows);
    if (act == kSwiGLU) {
      Y.narrow(0, first[e], rows.numel()).copy_(qmatmul(qmatmul(xs, g.qs, g.d, g.m, g.f, kSwiGLU), d.qs, d.d, d.m, d.f, 0));
      continue;
    }
    const int64_t n = rows.numel();
    at::Tensor gu = qmatmul(xs, g.qs, g.d, g.m, g.f, 0);  // (n, 2I): gate | up
    float* p = gu.data_ptr<float>();
    add_bias(p, 2 * I, table.gate_up_bias_of(e), n, 2 * I);
    at::Tensor a = at::empty({n, I}, x.options());
    for (int64_t m = 0; m < n; ++m) {
      std::copy_n(p + m * 2 * I, I, a.data_ptr<float>() + m * I);
      activate(a.data_ptr<float>() + m * I, p + m * 2 * I + I, I);
    }
    float* dst = y + first[e] * H;
    const at::Tensor yd = qmatmul(a, d.qs, d.d, d.m, d.f, 0);
    std::copy_n(yd.data_ptr<float>(), n * H, dst);
    add_bias(dst, H, table.down_bias_of(e), n, H);
  }
  // 4. each row's experts summed in ascending expert order
  float* o = out.data_ptr<float>();
  at::parallel_for(0, T, kSerialRows, [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> order(k);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t j = 0; j < k; ++j) order[j] = r * k + j;
      std::sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return slot_of[i] < slot_of[j]; });
      for (int64_t i : order) add_scaled(o + r * H, y + slot_of[i] * H, weight[i], H);
    }
  });
  return out;
}

// Router logits (T, E) = x W^T (+ bias), each an fp32 dot product in one fixed order (two 8-lane chains, isa.h's
// hsum, the tail, then the bias), so a row's logits, and so its experts, never depend on the batch: torch's
// sgemm sums in an order that depends on the row count (a row alone and the same row among 24 differed by up to
// 1e-4 on a 128 x 2048 router), and a near-tie between a row's k-th and (k+1)-th expert then routed it one way
// batched and the other alone. Experts split over the threads, each running every row against its router row.
at::Tensor router_logits(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  check_cpu_f32(x, "x");
  check_cpu_f32(w, "router");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "router_logits wants x (T, K) and a router (E, K)");
  const int64_t T = x.size(0), E = w.size(0), K = w.size(1);
  if (bias.has_value()) {
    check_cpu_f32(*bias, "router bias");
    TORCH_CHECK(bias->numel() == E, "the router bias wants one value an expert");
  }
  at::Tensor y = at::empty({T, E}, x.options());
  const float *xs = x.data_ptr<float>(), *ws = w.data_ptr<float>();
  const float* bs = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* ys = y.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, (int64_t)(1 << 16) / std::max<int64_t>(1, T * K));
  at::parallel_for(0, E, grain, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e)
      for (int64_t t = 0; t < T; ++t) {
        const float *a = xs + t * K, *b = ws + e * K;
        float r = 0.0f;
        int64_t i = 0;
#ifdef PD_AVX2
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        for (; i + 16 <= K; i += 16) {
          s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
          s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        }
        r = hsum(_mm256_add_ps(s0, s1));
#endif
        for (; i < K; ++i) r += a[i] * b[i];
        ys[t * E + e] = bs ? r + bs[e] : r;
      }
  });
  return y;
}

namespace {

at::Tensor moe_experts_op(const at::Tensor& x, const at::Tensor& experts, const at::Tensor& weights,
                          const c10::intrusive_ptr<MoEExperts>& table, int64_t act) {
  return moe_experts(x, experts, weights, *table, act);
}

// gpt-oss's clamped SwiGLU of [gate | up] rows (T, 2I) -> (T, I): the torch path's (engine.model.moe) and the
// kernel's epilogue, one function so that both round alike
at::Tensor clamped_swiglu_op(const at::Tensor& gate_up, double limit, double alpha) {
  return gated_rows(gate_up, [&](float* g, const float* u, int64_t n) {
    clamped_swiglu(g, u, n, (float)limit, (float)alpha);
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pagedeck, lib) {
  lib.class_<MoEExperts>("MoEExperts")
      .def(torch::init<std::vector<at::Tensor>, std::vector<int64_t>, std::vector<at::Tensor>, double, double>());
  lib.def("moe_experts(Tensor x, Tensor experts, Tensor weights, __torch__.torch.classes.pagedeck.MoEExperts table, "
          "int act) -> Tensor",
          &moe_experts_op);
  lib.def("clamped_swiglu(Tensor gate_up, float limit, float alpha) -> Tensor", &clamped_swiglu_op);
  lib.def("router_logits(Tensor x, Tensor router, Tensor? bias) -> Tensor", &router_logits);
}

}  // namespace pagedeck
