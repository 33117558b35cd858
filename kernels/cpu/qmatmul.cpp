// Packed-weight matmuls for decode-sized row counts: y = x @ W^T with W in 32-weight blocks.
//
// Formats (one kernel per format, one entry point):
//   q4: w = d * q + m, q in 0..15 (16 bytes of nibbles a block: low nibbles are weights 0..15, high 16..31,
//       GGUF's Q4_0/Q4_1 order), d and m fp16 per block.
//   q8: w = d * q, q int8 (GGUF's Q8_0) stored as u8 q + 128, d fp16 per block.
//   q6: GGUF Q6_K super-blocks as the file stores them (kquant.h, q6.h), no separate scales.
//   q3k: GGUF Q3_K super-blocks as the file stores them (kquant.h): q6's kernels through Q3_K's layout.
//   q2k: GGUF Q2_K super-blocks as the file stores them (kquant.h): q6's kernels through Q2_K's layout, its
//       minimums as q4k's.
//   q4k: GGUF Q4_K super-blocks as the file stores them (kquant.h, q4k.h), no separate scales.
//   q5k: GGUF Q5_K super-blocks as the file stores them (kquant.h): q4k's kernels with a fifth-bit plane.
//   q4k16: the same super-blocks with rows regrouped 16 at a time (q4k16.h; qs is (N / 16, K / 256 * 2304)),
//       the same bits as q4k without its per-row horizontal reductions.
//   q5k16: Q5_K super-blocks with rows regrouped 16 at a time (q5k16.h; qs is (N / 16, K / 256 * 2816)), q6k16's
//       scheme with q5k's bits.
//   iq4xs16: IQ4_XS super-blocks with rows regrouped 16 at a time (iq4xs16.h; qs is (N / 16, K / 256 * 2176)),
//       q6k16's scheme with iq4xs's bits.
//   q6k16: Q6_K super-blocks with rows regrouped 16 at a time (q6k16.h; qs is (N / 16, K / 256 * 3360)), the same
//       bits as q6, the codes taken apart once for all the activation rows of a call.
//   q3k16: Q3_K super-blocks with rows regrouped 16 at a time (q3k16.h; qs is (N / 16, K / 256 * 1760)), q6k16's
//       scheme with q3k's bits.
//   q5: w = d * q + m, q in 0..31 (GGUF Q5_0/Q5_1), q4's scales plus a fifth bit plane beside the nibbles
//       (affine.h; qs is (N, K / 32 * 20)), computed as q4 centred at 16.
//   q8g: q8 with rows regrouped 16 at a time in the GEMM panel's layout (q8.h; qs (N / 16, K / 32 * 512), d
//       (N / 16, K / 32 * 16)): every row count takes the GEMM tiles, with nothing to unpack; q8's bits.
//   q4g, q5g: q4 and q5 with rows regrouped 16 at a time (affine_groups.h; qs (N / 16, K / 32 * 256) and (N / 16,
//       K / 32 * 320), d and m (N / 16, K / 32 * 16)): the rows' bits without the per-row tile's horizontal sums.
//   mxfp4, iq4nl: GGUF MXFP4 / IQ4_NL blocks as the file stores them (lut4.h): 4-bit codes into a 16-entry int8
//       table, an exact fp32 scale per 32; multiplied as q8 (their panels are q8's).
//   iq4xs: GGUF IQ4_XS super-blocks as the file stores them (lut4.h's codes, iq4xs.h's kernels): the IQ4_NL table
//       with 6-bit sub-block scales applied as integers, as the K-quants are.
//   q5s: GGUF Q5_0 blocks as the file stores them (affine.h; qs is (N, K / 32 * 22)), q5's kernels and bits:
//       what a model reads while its mapped file's Q5_0 blocks move into q5's layout (engine.model.settle).
//   q8s: GGUF Q8_0 blocks as the file stores them (lut4.h; qs is (N, K / 32 * 34)), q8's bits: what a model
//       reads while its mapped file's Q8_0 blocks move into q8's layout (engine.model.settle).
// Activations are quantized per row and block to int8 (d_x = max|x| / 127; per 256 for the K-quants and iq4xs) and
// multiplied with integer dot products (AVX2 maddubs, or AVX512-VNNI dpbusd where the compiler may use it), as
// llama.cpp does. q4 is computed centred, w = d (q - 8) + z with z = m + 8d, and z multiplies the exact fp32 block
// sum of x: the activation rounding error then meets only d (q - 8), not the block offset (Q4_1 blocks often have |m|
// ~ 8d, and charging the error to d q + m instead was 5x worse on the default model). Every output element is
// computed by the same sequence of operations whatever the number of rows or threads, so results never depend on the
// batch.
//
// This file is the scheduling: a call's format id (formats.h, generated from kernels/formats.py) is checked
// against its tensors and becomes its kernels through dispatch.h (with_format, weight_row; moe.cpp's expert
// tasks share them), and output rows or panels are handed to threads. The kernels live by concept: isa.h (the
// instruction-set switches and shared vector primitives), activations.h (activation quantisation, SwiGLU),
// rows.h (the per-row tiles of q4, q5 and q8), panel.h and qgemm.h (the GEMM panel layout and tiles), and one
// header per format family: affine.h (q4, q5) with affine_groups.h (q4g, q5g), q8.h (q8, q8g), kquant.h (the
// K-quant super-blocks) with q6.h, q6k16.h, q3k16.h, q4k.h, q4k16.h and q5k16.h (their kernels), lut4.h (mxfp4,
// iq4nl, iq4xs, q8s) with iq4xs.h and iq4xs16.h.
#include "activations.h"
#include "affine.h"
#include "common.h"
#include "dispatch.h"
#include "formats.h"
#include "iq4xs.h"
#include "iq4xs16.h"
#include "kquant.h"
#include "lut4.h"
#include "ops.h"
#include "q4k.h"
#include "q4k16.h"
#include "q6.h"
#include "q5k16.h"
#include "q6k16.h"
#include "q8.h"
#include "qgemm.h"
#include "rows.h"

#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <vector>

namespace pagedeck {
namespace {

enum Act : int64_t { kNone = 0, kSwiGLU = 1 };
constexpr int64_t kScalePad = 8;  // fp16 values after a scale tensor's end (see load_halfs)

// The formats' ids and layouts: formats.h, generated from kernels/formats.py (the one table)
using formats::Format;
using formats::kQ4;
using formats::kQ4K;
using formats::kQ4K16;
using formats::kQ5;
using formats::kQ5K;
using formats::kQ5K16;
using formats::kQ5S;
using formats::kIQ4XS16;
using formats::kQ2K;
using formats::kQ3K;
using formats::kQ3K16;
using formats::kQ6;
using formats::kQ6K16;
using formats::kQ8;
using formats::kQ8G;
using formats::kQ4G;
using formats::kQ5G;
using rows::Weights;

// The grouped formats (q4k16, q6k16): y rows [n0, n1) (multiples of 16) a group at a time; SwiGLU's gate groups
// of the range, then its up groups, so that each pass streams its own half of W (alternating a gate and an up
// group switched streams every 14-20 KB at 1536 wide).
template <int F>
void compute_groups(const Weights& w, const QuantAct& a, int64_t M, int64_t Nout, Act act, int64_t n0, int64_t n1,
                    float* y) {
  constexpr int64_t kRows = formats::kLayouts[F].rows;
  const int64_t len = n1 - n0;
  thread_local std::vector<float> buf, gate, up;
  buf.resize(M * kRows);
  auto pass = [&](int64_t first, float* out, int64_t ldo) {  // rows [first, first + len) into out (M, ldo)
    for (int64_t n = 0; n < len; n += kRows) {
      group_rows<F>(w, a, M, (first + n) / kRows, buf.data());
      for (int64_t m = 0; m < M; ++m) std::memcpy(out + m * ldo + n, buf.data() + m * kRows, kRows * sizeof(float));
    }
  };
  if (act != kSwiGLU) return pass(n0, y + n0, Nout);
  gate.resize(M * len);
  up.resize(M * len);
  pass(n0, gate.data(), len);
  pass(n0 + Nout, up.data(), len);
  for (int64_t m = 0; m < M; ++m) {
    silu_mul(gate.data() + m * len, up.data() + m * len, len);
    std::memcpy(y + m * Nout + n0, gate.data() + m * len, len * sizeof(float));
  }
}

// Weight rows of at most this many code bytes go two at a time through rows.h's tile at one activation row
// (dot_tile<1, 2>: two independent dependency chains; the tile shape never changes a result). On short rows
// the pair is one stream: one core on the default model's 576-wide q4 rows from cache 16-25 -> 23-36 GB/s,
// its decode step ~7 % faster. Longer rows stay one at a time: there the pair is two DRAM streams, and a
// Q8_0 1.5B file's step ran 29 -> 38 ms with every row paired (docs/performance/log-4.md).
constexpr int64_t kPairedRowBytes = 512;

// y (M, Nout) for rows [n0, n1) of the output; SwiGLU pairs gate row i with up row i + Nout.
template <int F>
void compute(const Weights& w, const QuantAct& a, int64_t M, int64_t Nout, Act act, int64_t n0, int64_t n1, float* y) {
  thread_local std::vector<float> buf, gate, up;
  buf.resize(M);
  const int64_t len = n1 - n0;
  if constexpr (rows::nibbled(F) || F == kQ8) {  // rows.h's per-32 formats
    const int64_t row_bytes = w.nb * (F == kQ5S ? q5s::kBytes : F == kQ5 ? q5::kBytes : F == kQ4 ? 16 : 32);
    if (M == 1 && row_bytes <= kPairedRowBytes) {
      auto run = [&](int64_t r0, int64_t r1, float* out) {  // weight rows [r0, r1) into out[0, r1 - r0)
        int64_t n = r0;
        for (; n + 2 <= r1; n += 2) rows::dot_tile<1, 2, F>(w, n, a, 0, out + n - r0, 1);
        if (n < r1) rows::dot_tile<1, 1, F>(w, n, a, 0, out + n - r0, 1);
      };
      if (act == kNone) return run(n0, n1, y + n0);
      gate.resize(len);
      up.resize(len);
      run(n0, n1, gate.data());
      run(n0 + Nout, n1 + Nout, up.data());
      silu_mul(gate.data(), up.data(), len);
      std::memcpy(y + n0, gate.data(), len * sizeof(float));
      return;
    }
  }
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
  if constexpr (F == formats::kIQ4XS) {
    iq4xs::unpack_panel(w.qs, w.nb, n0, cols, panel);
  } else if constexpr (lut4::kIs<F>) {
    lut4::unpack_panel<typename lut4::Of<F>::type>(w.qs, w.nb, n0, cols, panel);
  } else if (F == kQ4K16) {
    q4k16::unpack_panel(w.qs, w.nb, n0 / q4k16::kRows, panel);
  } else if (F == kQ6K16) {
    q6k16::unpack_panel(w.qs, w.nb, n0 / q6k16::kRows, panel);
  } else if (F == kQ3K16) {
    q3k16::unpack_panel(w.qs, w.nb, n0 / q3k16::kRows, panel);
  } else if (F == kQ5K16) {
    q5k16::unpack_panel(w.qs, w.nb, n0 / q5k16::kRows, panel);
  } else if (F == kIQ4XS16) {
    iq4xs16::unpack_panel(w.qs, w.nb, n0 / iq4xs16::kRows, panel);
  } else if (F == kQ4G) {
    affine_groups::unpack_panel<affine_groups::Q4G>(w.qs, w.d, w.m, w.nb, n0 / affine_groups::kRows, panel);
  } else if (F == kQ5G) {
    affine_groups::unpack_panel<affine_groups::Q5G>(w.qs, w.d, w.m, w.nb, n0 / affine_groups::kRows, panel);
  } else if (F == kQ6) {
    q6::unpack_panel(w.qs, w.nb, n0, cols, panel);
  } else if (F == kQ3K) {
    q6::unpack_panel<q6::Q3K>(w.qs, w.nb, n0, cols, panel);
  } else if (F == kQ2K) {
    q6::unpack_panel<q6::Q2K>(w.qs, w.nb, n0, cols, panel);
  } else if (F == kQ4K) {
    q4k::unpack_panel(w.qs, w.nb, n0, cols, panel);
  } else if (F == kQ5K) {
    q4k::unpack_panel<q4k::Q5K>(w.qs, w.nb, n0, cols, panel);
  } else {
    gemm::unpack_panel(w.qs, w.d, w.m, w.nb, F, n0, cols, panel);
  }
  return panel.view();
}

// The prompt-rows path (qgemm.h): y (M, Nout) for panels [p0, p1) of gemm::kCols output columns each; SwiGLU
// computes the gate and the up panel of the same columns, then silu(gate) * up.
template <int F>
void gemm_compute(const Weights& w, const gemm::Act& a, const ActK& ak, int64_t M, int64_t Nout, Act act,
                  int64_t p0, int64_t p1, float* y) {
  using gemm::kCols;
  constexpr bool Q4K = F == kQ4K || F == kQ4K16 || F == kQ5K || F == kQ5K16;  // q4k.h's panels and tiles
  constexpr bool Q6 = F == kQ6 || F == kQ6K16, Q3K = F == kQ3K || F == kQ3K16, Q2K = F == kQ2K;  // q6.h's
  constexpr bool IQ4XS = F == formats::kIQ4XS || F == kIQ4XS16;                // iq4xs.h's
  constexpr int G = Q4K || Q6 || Q3K || Q2K || IQ4XS ? (int)gemm::kQ4  // (their own tiles below: G unused)
                    : F == kQ8G || lut4::kIs<F> ? (int)gemm::kQ8
                    : F == kQ5S                 ? (int)kQ5
                    : F == kQ4G                 ? (int)kQ4
                    : F == kQ5G                 ? (int)kQ5
                                                : F;
  thread_local gemm::Panel panel;
  thread_local std::vector<float> gate, up, dw;
  auto rows = [&](const gemm::View& v, float* o, int64_t ldo, int cols) {
    if constexpr (Q4K || Q6 || Q3K || Q2K || IQ4XS) {  // M rows in tiles of gemm::kRowsK, each its format's tile
      gemm::row_tiles(M, [&](auto R, int64_t m) {
        auto* at = o + m * ldo;
        if constexpr (Q4K) q4k::gemm_tile<R>(panel, ak, w.K, m, at, ldo, cols);
        if constexpr (Q6) q6::gemm_tile<q6::Q6K, R>(panel, ak, w.K, m, at, ldo, cols);
        if constexpr (Q3K) q6::gemm_tile<q6::Q3K, R>(panel, ak, w.K, m, at, ldo, cols);
        if constexpr (Q2K) q6::gemm_tile<q6::Q2K, R>(panel, ak, w.K, m, at, ldo, cols);
        if constexpr (IQ4XS) iq4xs::gemm_tile<R>(panel, ak, w.K, m, at, ldo, cols);
      });
    } else if (F != kQ4G || w.m) {
      gemm::panel_rows<G>(v, a, M, o, ldo, cols);
    } else {  // q4g without minimums (Q4_0): q8's tiles (affine_groups.h)
      gemm::panel_rows<gemm::kCentred>(v, a, M, o, ldo, cols);
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
// the GEMM, 1.20x / 1.20x at 16, 1.05x / 1.13x at 24, and 0.95x on the 3B at 32. q4, q8 and q6 cross near 8;
// so does mxfp4, whose per-row path reads 8 blocks a 512-bit step. iq4xs's crosses at 10-14 (its panels unpack
// slowly): the 8-row decode step of a Qwen2.5-1.5B-shaped IQ4_XS file spent 78 ms in its matrices through the
// per-row path against 97 ms through the GEMM (tools.bench.step_profile --per-op, PAGEDECK_QGEMM_ROWS 16 vs 8).
// q5k's rows (not grouped as q4k16's are) cost each activation row nearly a one-row call: random Q5_K matrices
// of Qwen2.5-1.5B's gate and down shapes, 8 a call, 2 threads, GEMM / per-row time 1.38 and 1.05 at 8 rows,
// 0.94 and 0.77 at 12, 0.80 and 0.65 at 16. q6k16's group kernel (one dpbusd per 4 codes of 16 rows, the codes
// unpacked once a call) keeps up with the GEMM to ~64 rows (`python -m tools.bench.qmatmul_bench --prompt-rows
// 32,64,128 --threads 2 --gemm-format q6`, int8 multiply-adds a CPU second, GEMM / group kernel: 0.76-1.01 at 32
// rows, 1.00-1.19 at 64, 1.03-1.22 at 128). q5k16's group kernel stays ahead to ~384-512 rows (its panels unpack
// through the rows): --gemm-format q5k, 2 threads, GEMM / group kernel time 2.6-3.0 at 64 rows, 1.16-1.2 at 256,
// 0.96-1.04 at 384, 0.90-0.96 at 512, 0.80-0.89 at 768. iq4xs16's keeps up to ~64 rows (--gemm-format iq4xs,
// GEMM / group kernel rate: 0.41-0.87 at 32 rows, 0.95-1.04 at 64, 1.10-1.17 at 128, 1.13-1.53 at 256).
// Short rows move q4 and q8 to the GEMM from 5 rows: dot_tile's per-group epilogue and final sums weigh on a
// row of K <= 2048 (18-64 blocks), so each activation row costs it nearly a one-row call. The default model's
// whole decode step (K 576 and 1536; 1,900 positions, fp16 K/V, `tools.bench.step_profile --batches B`,
// PAGEDECK_QGEMM_ROWS 2 against 8, two alternating runs) at 3 / 4 / 5 / 6 / 7 rows: 12.7 / 14.3 / 16.5 / 18.8 /
// 20.6 ms through the GEMM against 12.9 / 14.1 / 17.0 / 20.5 / 23.9 per row; at 2 rows 10.5 against 10.2; a
// Qwen2.5-1.5B-shaped Q8_0 file's step at 6 rows (500 positions) 91 ms under this rule against 111 ms (82 ms
// with its 8960-wide down projection through the GEMM too: wider rows may cross lower than 8 as well). Not
// q5, whose panels unpack slowly: a Gemma-3-270M-shaped file's Q5_0 matrices (K 640) at 4 rows took 6.0 ms
// through the GEMM against 3.3 ms per row (--per-op).
// The overrides of gemm_rows and row_chunk below (kUnset: none): PAGEDECK_QGEMM_ROWS and PAGEDECK_ROW_CHUNK,
// given once when the extension loads (kernels/cpu_ext.py, set_tuning) and by benchmarks and tests comparing
// paths in one process (cpu_ext.set_tuning); a matmul reads these, never the environment.
constexpr int64_t kUnset = std::numeric_limits<int64_t>::min();
std::atomic<int64_t> forced_gemm_rows{kUnset}, forced_row_chunk{kUnset};

// q4g's and q5g's group kernel (the group read again from L1 for each activation row) keeps ahead of the GEMM to
// ~24 rows: random q4g matrices of the default model's shapes and a 1.5B's gate|up, 2 threads, GEMM / group kernel time
// 1.42-1.75 at 4 rows, 1.20-1.29 at 8, 1.01-1.14 at 16, 0.94-1.05 at 24, 0.90-1.00 at 32 (docs/performance/log-4.md).
constexpr int64_t kQ4GemmRows = 24;

int64_t gemm_rows(Format f, int64_t K) {
  const int64_t forced = forced_gemm_rows.load(std::memory_order_relaxed);
  if (forced != kUnset) return forced;
  if ((f == kQ4 || f == kQ8) && K <= 2048) return 5;
  if (f == kQ4G || f == kQ5G) return kQ4GemmRows;
  if (f == kQ5K16) return 512;
  if (f == kIQ4XS16) return 64;
  if (f == kQ6K16 || f == kQ3K16) return 64;
  return f == kQ4K || f == kQ4K16 ? 32 : f == kQ5K || f == formats::kIQ4XS ? 12 : 8;
}

// Output rows per chunk of the per-row path, one activation row: ~kChunkBytes of weights, so that each thread
// streams long contiguous runs (16-row chunks, 36 KB of a 4096-wide Q4_K matrix, interleaved the two threads'
// reads every 36 KB: the 8B-shaped file's whole step was 1.22-1.28x slower with them than with 64-256 rows,
// alternated in one process), but at least 4 chunks a thread so that the threads still finish together on
// small matrices (a chunk is the most one thread can be left doing alone); several activation rows, 8 rows,
// except for the grouped formats, whose kernels cost too little per byte for that: 16-row chunks of q6k16 at
// 1536 wide (20 KB each) ran 8 rows 1.3-1.4x slower than 128-row ones.
// PAGEDECK_ROW_CHUNK overrides it (benchmarks compare splits in one process; 0: one range per thread).
constexpr int64_t kChunkBytes = 512 << 10;

int64_t row_chunk(int64_t Nout, int64_t M, int64_t row_bytes, bool groups) {
  const int64_t forced = forced_row_chunk.load(std::memory_order_relaxed);
  const int64_t threads = at::get_num_threads();
  if (forced != kUnset) return forced > 0 ? forced : (Nout + threads - 1) / threads;
  if (M > 1 && !groups) return 8;
  const int64_t rows = std::min(kChunkBytes / std::max<int64_t>(row_bytes, 1), Nout / (4 * threads));
  return std::max<int64_t>(16, rows / 16 * 16);
}

}  // namespace

at::Tensor qmatmul(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, const c10::optional<at::Tensor>& m,
                   int64_t fmt, int64_t act) {
  check_cpu_f32(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be (M, K)");
  TORCH_CHECK(fmt >= 0 && fmt < formats::kCount, "unknown packed format id ", fmt, " (kernels/formats.py)");
  const formats::Layout& L = formats::kLayouts[fmt];
  const Format f = (Format)fmt;
  const int64_t M = x.size(0), K = x.size(1), nb = K / kBlock;
  TORCH_CHECK(K % kBlock == 0, "K must be a multiple of 32, got ", K);
  TORCH_CHECK(K % L.values == 0, L.name, " weights need K a multiple of ", L.values, ", got ", K);
  // The declared format's layout, checked, never guessed from the shapes: qs is (N / rows, K / values *
  // code_bytes * rows) uint8, so weights of another format are refused even where a row's bytes would fit.
  const int64_t row_bytes = K / L.values * L.code_bytes * L.rows;
  TORCH_CHECK(qs.scalar_type() == at::kByte && qs.is_contiguous() && qs.dim() == 2 && qs.size(1) == row_bytes,
              "packed weights do not match their declared format ", L.name, " (id ", fmt, ") at K = ", K,
              ": qs must be contiguous uint8 (", L.rows > 1 ? "N/16" : "N", ", ", row_bytes, "), got ",
              qs.scalar_type(), " ", qs.sizes());
  const bool affine = L.scales == 2;  // q4 and q5: a scale and a minimum per block
  const bool q8g = f == kQ8G, grouped_scales = q8g || f == kQ4G || f == kQ5G;  // scales (N / 16, K / 32 * 16), by group
  // q4g and q5g may leave out a minimum of -c d (GGUF Q4_0, Q5_0: affine_groups.h)
  TORCH_CHECK(m.has_value() == affine || (affine && grouped_scales), L.name, " weights ",
              affine ? "need" : "have no", " minimums");
  const int64_t N = qs.size(0) * L.rows;
  auto padded = [&](const at::Tensor& t) {  // kernels read up to 7 scales past the last row's end
    return t.scalar_type() == at::kHalf && t.is_contiguous() && t.dim() == 2 && t.size(0) == N && t.size(1) == nb &&
           (int64_t)t.storage().nbytes() >= (t.storage_offset() + N * nb + kScalePad) * 2;
  };
  auto by_group = [&](const at::Tensor& t) {
    return t.scalar_type() == at::kHalf && t.is_contiguous() && t.dim() == 2 && t.size(0) == qs.size(0) &&
           t.size(1) == nb * L.rows;
  };
  TORCH_CHECK(!grouped_scales || (by_group(d) && (!m || by_group(*m))), L.name,
              affine ? " scales and minimums" : " scales", " must be (N/16, K/32 * 16) fp16");
  TORCH_CHECK(L.scales == 0 || grouped_scales || padded(d), "scales must be (N, K/32) fp16 with ", kScalePad,
              " values of padding after them");
  TORCH_CHECK(!affine || grouped_scales || padded(*m), "minimums must be (N, K/32) fp16 with ", kScalePad,
              " values of padding after them");
  TORCH_CHECK(act == kNone || (act == kSwiGLU && N % (2 * L.rows) == 0), "bad activation");
  const int64_t Nout = act == kSwiGLU ? N / 2 : N;
  at::Tensor y = at::empty({M, Nout}, x.options());
  if (M == 0) return y;
  QuantAct& a = scratch();
#ifdef PD_AVX2
  const bool big = q8g || M >= gemm_rows(f, K);
#else
  TORCH_CHECK(!q8g, "q8g weights need the AVX2 kernels");
  const bool big = false;
#endif
  if (row_acts(f) == RowActs::kPer256) {  // the K-quants (q4k.h, q6.h)
    quantize_k(x.data_ptr<float>(), M, K, a.k);
  } else {
    quantize_rows(x.data_ptr<float>(), M, K, a, row_acts(f) == RowActs::kPaired && !big);
  }
  Weights w{(const uint8_t*)qs.data_ptr(), L.scales == 0 ? nullptr : (const uint16_t*)d.data_ptr(),
            m ? (const uint16_t*)m->data_ptr() : nullptr, K, nb};
  float* out = y.data_ptr<float>();
  const Act ac = (Act)act;
#ifdef PD_AVX2
  if (big) {
    const gemm::Act ga{a.q.data(), a.d.data(), a.s.data(), a.c.data(), a.isum.data(), nb, a.nbp};
    // Panels go out in chunks from a shared counter, not in one fixed share per thread: on a machine shared
    // with other processes a descheduled thread's half held the call up (a 512-row prefill ran at one
    // thread's speed). Every element's arithmetic is the same whichever thread takes its panel.
    const int64_t panels = (Nout + gemm::kCols - 1) / gemm::kCols, threads = at::get_num_threads();
    const int64_t chunk = std::max<int64_t>(1, panels / (8 * threads));
    std::atomic<int64_t> next{0};
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
      for (int64_t p0; (p0 = next.fetch_add(chunk)) < panels;) {
        const int64_t p1 = std::min(panels, p0 + chunk);
        with_format(f, [&](auto F) { gemm_compute<decltype(F)::value>(w, ga, a.k, M, Nout, ac, p0, p1, out); });
      }
    });
    return y;
  }
#endif
  // Output rows go in chunks taken from a shared counter (ggml's scheme), not in one fixed range per thread:
  // on a shared machine a thread that loses its core for a while no longer leaves the other waiting at the
  // join with its whole half still to do. Each row's result is the same whichever thread computes it.
  int64_t chunk = row_chunk(Nout, M, qs.numel() / N, L.rows > 1);  // a row's bytes (q4's scales and minimums aside)
  if (L.rows > 1) chunk = (chunk + L.rows - 1) / L.rows * L.rows;  // whole groups
  const int64_t chunks = (Nout + chunk - 1) / chunk;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), chunks), 1, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      const int64_t n0 = c * chunk, n1 = std::min(Nout, n0 + chunk);
      with_format(f, [&](auto F) {
        constexpr int G = decltype(F)::value;
        if constexpr (grouped_rows(G)) {
          compute_groups<G>(w, a, M, Nout, ac, n0, n1, out);
        } else if constexpr (G != kQ8G) {  // q8g always takes the GEMM tiles (big)
          compute<G>(w, a, M, Nout, ac, n0, n1, out);
        }
      });
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

// The grouped formats whose 16-row kernel is vectorized in this build (the others run each row of a group
// through the rows' kernel: correct, slower than keeping the rows); the loader groups only these.
std::vector<int64_t> native_groups() {
  std::vector<int64_t> ids;
#ifdef PD_AVX2
  ids.push_back(kQ4K16);
#endif
#ifdef PD_AVX512
  ids.push_back(kQ4G);
  ids.push_back(kQ5G);
  ids.push_back(kQ6K16);
  ids.push_back(kQ5K16);
  ids.push_back(kIQ4XS16);
  ids.push_back(kQ3K16);
#endif
  return ids;
}

// silu(gate) * up of gate_up (rows, 2 I) = [gate | up] -> (rows, I), as the matmul's fused epilogue computes it:
// for a [gate | up] held in parts (engine.model.qlinear.PartsLinear), whose rows then match the fused matrix's.
at::Tensor silu_mul_op(const at::Tensor& gate_up) {
  return gated_rows(gate_up, [](float* g, const float* u, int64_t n) { silu_mul(g, u, n); });
}

TORCH_LIBRARY_FRAGMENT(pagedeck, lib) {
  lib.def("silu_mul(Tensor gate_up) -> Tensor", &silu_mul_op);
  lib.def("set_tuning(int? qgemm_rows, int? row_chunk) -> ()", &set_tuning);
  lib.def("get_tuning() -> int[]", &get_tuning);
  lib.def("native_groups() -> int[]", &native_groups);
  lib.def("qmatmul(Tensor x, Tensor qs, Tensor d, Tensor? m, int fmt, int act) -> Tensor", &qmatmul);
}

}  // namespace pagedeck
