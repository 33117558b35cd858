// A packed format id (formats.h) becomes its kernels here, in one place for every caller: qmatmul.cpp's
// per-row and GEMM paths and moe.cpp's expert tasks dispatch through with_format, and both run a format's
// per-row product as weight_row<F>, so an expert's rows in the MoE kernel get exactly qmatmul's arithmetic.
#pragma once

#include "activations.h"
#include "affine.h"
#include "common.h"
#include "formats.h"
#include "iq4xs.h"
#include "iq4xs16.h"
#include "kquant.h"
#include "lut4.h"
#include "q4k.h"
#include "affine_groups.h"
#include "q4k16.h"
#include "q6.h"
#include "q5k16.h"
#include "q6k16.h"
#include "q3k16.h"
#include "q8.h"
#include "rows.h"

#include <type_traits>

namespace pagedeck {

static_assert(formats::kLayouts[formats::kQ5].code_bytes == q5::kBytes &&
                  formats::kLayouts[formats::kQ6].code_bytes == q6::kBytes &&
                  formats::kLayouts[formats::kQ3K].code_bytes == q3k::kBytes &&
                  formats::kLayouts[formats::kQ3K].values == q3k::kSuper &&
                  formats::kLayouts[formats::kQ2K].code_bytes == q2k::kBytes &&
                  formats::kLayouts[formats::kQ2K].values == q2k::kSuper &&
                  formats::kLayouts[formats::kQ3K16].code_bytes * formats::kLayouts[formats::kQ3K16].rows ==
                      q3k16::kGroupBytes &&
                  formats::kLayouts[formats::kQ4K].code_bytes == q4k::kBytes &&
                  formats::kLayouts[formats::kQ4K16].code_bytes * formats::kLayouts[formats::kQ4K16].rows ==
                      q4k16::kGroupBytes &&
                  formats::kLayouts[formats::kQ6K16].code_bytes * formats::kLayouts[formats::kQ6K16].rows ==
                      q6k16::kGroupBytes &&
                  formats::kLayouts[formats::kQ5K16].code_bytes * formats::kLayouts[formats::kQ5K16].rows ==
                      q5k16::kGroupBytes &&
                  formats::kLayouts[formats::kIQ4XS16].code_bytes * formats::kLayouts[formats::kIQ4XS16].rows ==
                      iq4xs16::kGroupBytes &&
                  formats::kLayouts[formats::kQ8G].rows == q8g::kRows &&
                  formats::kLayouts[formats::kQ4G].rows == affine_groups::kRows &&
                  formats::kLayouts[formats::kQ4G].code_bytes * formats::kLayouts[formats::kQ4G].rows ==
                      affine_groups::Q4G::kBlockBytes &&
                  formats::kLayouts[formats::kQ5G].code_bytes * formats::kLayouts[formats::kQ5G].rows ==
                      affine_groups::Q5G::kBlockBytes &&
                  formats::kLayouts[formats::kQ4K].values == q4k::kSuper &&
                  formats::kLayouts[formats::kMXFP4].code_bytes == lut4::Mxfp4::kBytes &&
                  formats::kLayouts[formats::kIQ4NL].code_bytes == lut4::Iq4nl::kBytes &&
                  formats::kLayouts[formats::kIQ4XS].code_bytes == lut4::Iq4xs::kBytes &&
                  formats::kLayouts[formats::kIQ4XS].values == lut4::Iq4xs::kValues &&
                  formats::kLayouts[formats::kQ8S].code_bytes == lut4::Q8s::kBytes &&
                  formats::kLayouts[formats::kQ5S].code_bytes == q5s::kBytes &&
                  formats::kLayouts[formats::kQ5K].code_bytes == q4k::Q5K::kBytes &&
                  formats::kLayouts[formats::kQ5K].values == q4k::kSuper,
              "kernels/formats.py and the format headers disagree: regenerate formats.h (python -m kernels.formats)");

// fn(std::integral_constant<int, F>{}) for the format F of id f: the one place a format id becomes a kernel
template <class Fn>
void with_format(formats::Format f, Fn&& fn) {
  using namespace formats;
  switch (f) {
    case kQ8: return fn(std::integral_constant<int, kQ8>{});
    case kQ4: return fn(std::integral_constant<int, kQ4>{});
    case kQ6: return fn(std::integral_constant<int, kQ6>{});
    case kQ4K: return fn(std::integral_constant<int, kQ4K>{});
    case kQ4K16: return fn(std::integral_constant<int, kQ4K16>{});
    case kQ5: return fn(std::integral_constant<int, kQ5>{});
    case kQ8G: return fn(std::integral_constant<int, kQ8G>{});
    case kMXFP4: return fn(std::integral_constant<int, kMXFP4>{});
    case kIQ4NL: return fn(std::integral_constant<int, kIQ4NL>{});
    case kIQ4XS: return fn(std::integral_constant<int, kIQ4XS>{});
    case kQ5K: return fn(std::integral_constant<int, kQ5K>{});
    case kQ6K16: return fn(std::integral_constant<int, kQ6K16>{});
    case kQ5K16: return fn(std::integral_constant<int, kQ5K16>{});
    case kIQ4XS16: return fn(std::integral_constant<int, kIQ4XS16>{});
    case kQ8S: return fn(std::integral_constant<int, kQ8S>{});
    case kQ5S: return fn(std::integral_constant<int, kQ5S>{});
    case kQ3K: return fn(std::integral_constant<int, kQ3K>{});
    case kQ3K16: return fn(std::integral_constant<int, kQ3K16>{});
    case kQ2K: return fn(std::integral_constant<int, kQ2K>{});
    case kQ4G: return fn(std::integral_constant<int, kQ4G>{});
    case kQ5G: return fn(std::integral_constant<int, kQ5G>{});
  }
  TORCH_CHECK(false, "unknown packed format id ", (int)f);
}

// The activations a format's per-row kernel reads: Q8_K per 256 (the K-quants q4k, q5k, q6, q3k, iq4xs and their
// groups: quantize_k; q2k), per 32 in q4's paired layout (q4, q5, q5s), or per 32 in natural order (q8, mxfp4, iq4nl,
// q8s, q4g, q5g: quantize_rows without pairs).
enum class RowActs : int { kPer256 = 0, kPaired = 1, kNatural = 2 };
constexpr int kRowActKinds = 3;

constexpr RowActs row_acts(int F) {
  using namespace formats;
  if (F == kQ4K || F == kQ4K16 || F == kQ5K || F == kQ5K16 || F == kQ6 || F == kQ6K16 || F == kQ3K || F == kQ3K16 ||
      F == kQ2K || F == kIQ4XS || F == kIQ4XS16)
    return RowActs::kPer256;
  return F == kQ4 || F == kQ5 || F == kQ5S ? RowActs::kPaired : RowActs::kNatural;
}

// Whether format F has per-row kernels (weight_row, or the grouped formats' 16-row groups): q8g has only GEMM
// tiles.
constexpr bool has_row_kernel(int F) { return F != formats::kQ8G; }

// out[m] = row n of W . activation row m, for all M rows: up to 4 activation rows share each unpacked weight row.
// Weight rows go strictly one after another: tiles that interleaved 2-4 weight rows read 2.7x slower from
// DRAM (the prefetchers lose the streams; 4.9 vs 13 GB/s for the q8 head, measured), and software
// prefetching did not win that back. (The grouped formats compute 16-row groups instead: group_rows below;
// short rows at one activation row go in pairs, one stream still: qmatmul.cpp's kPairedRowBytes.)
template <int F>
void weight_row(const rows::Weights& w, const QuantAct& a, int64_t M, int64_t n, float* out) {
  using namespace formats;
  static_assert(F != kQ4K16 && F != kQ5K16 && F != kQ6K16 && F != kQ3K16 && F != kIQ4XS16 && F != kQ8G && F != kQ4G &&
                    F != kQ5G,
                "the grouped formats go by 16-row groups, q8g by GEMM tiles");
  if constexpr (F == kQ6) {
    q6::weight_row(w.qs, w.K, a.k, M, n, out);
  } else if constexpr (F == kQ3K) {
    q6::weight_row<q6::Q3K>(w.qs, w.K, a.k, M, n, out);
  } else if constexpr (F == kQ2K) {
    q6::weight_row<q6::Q2K>(w.qs, w.K, a.k, M, n, out);
  } else if constexpr (F == kQ4K) {
    q4k::weight_row(w.qs, w.K, a.k, M, n, out);
  } else if constexpr (F == kQ5K) {
    q4k::weight_row<q4k::Q5K>(w.qs, w.K, a.k, M, n, out);
  } else if constexpr (F == kIQ4XS) {
    iq4xs::weight_row(w.qs, w.K, a.k, M, n, out);
  } else if constexpr (lut4::kIs<F>) {
    lut4::weight_row<typename lut4::Of<F>::type>(w.qs, w.K, a, M, n, out);
  } else {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) rows::dot_tile<4, 1, F>(w, n, a, m, out + m, 1);
    if (M - m == 3) rows::dot_tile<3, 1, F>(w, n, a, m, out + m, 1);  // the rest in one tile: the weight row
    if (M - m == 2) rows::dot_tile<2, 1, F>(w, n, a, m, out + m, 1);  // unpacked once for them all
    if (M - m == 1) rows::dot_tile<1, 1, F>(w, n, a, m, out + m, 1);
  }
}

// Whether format F keeps its rows in 16-row groups whose kernel computes a whole group (group_rows).
constexpr bool grouped_rows(int F) {
  return F == formats::kQ4K16 || F == formats::kQ5K16 || F == formats::kQ6K16 || F == formats::kQ3K16 ||
         F == formats::kIQ4XS16 || F == formats::kQ4G || F == formats::kQ5G;
}

// out[m * 16 + r] = weight row 16 g + r . activation row m, for all M rows, of a grouped format F
template <int F>
void group_rows(const rows::Weights& w, const QuantAct& a, int64_t M, int64_t g, float* out) {
  static_assert(grouped_rows(F), "group_rows takes the grouped formats");
  if constexpr (F == formats::kQ4K16) {
    q4k16::group_rows(w.qs, w.K, a.k, M, g, out);
  } else if constexpr (F == formats::kQ5K16) {
    q5k16::group_rows(w.qs, w.K, a.k, M, g, out);
  } else if constexpr (F == formats::kIQ4XS16) {
    iq4xs16::group_rows(w.qs, w.K, a.k, M, g, out);
  } else if constexpr (F == formats::kQ3K16) {
    q3k16::group_rows(w.qs, w.K, a.k, M, g, out);
  } else if constexpr (F == formats::kQ4G) {
    affine_groups::group_rows<affine_groups::Q4G>(w.qs, w.d, w.m, w.nb, a, M, g, out);
  } else if constexpr (F == formats::kQ5G) {
    affine_groups::group_rows<affine_groups::Q5G>(w.qs, w.d, w.m, w.nb, a, M, g, out);
  } else {
    q6k16::group_rows(w.qs, w.K, a.k, M, g, out);
  }
}

}  // namespace pagedeck
