// Packed rows back to their exact fp32 weights, into a caller's buffer (engine.model.qlinear.dense_product):
// a small model's prompt rows multiply the dense weights without a kept fp32 copy of the model, one matrix
// (or slab of rows) decoded just in time into a reused scratch buffer. Bits equal kernels.packed's
// q4_dequantize / q5_dequantize / q8_dequantize and gguf's own decode of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 blocks:
// code * scale is exact in fp32 (4- to 8-bit code times an fp16 scale), so the one rounding left is q4's and
// q5's "+ minimum", as there.
#include "common.h"
#include "affine.h"
#include "affine_groups.h"

#include <torch/library.h>

namespace pagedeck {
namespace {

void check_rows(const at::Tensor& t, at::ScalarType type, int64_t n, int64_t cols, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.dim() == 2 && t.size(0) == n && t.size(1) == cols &&
                  t.stride(1) == 1,
              name, " must be (", n, ", ", cols, ") rows with unit column stride");
}

// n rows of an affine format (w = code * scale + minimum per block of 32) -> out (n, groups * 32) fp32;
// block(r, g, c, d, m) writes row r's block g's 32 codes into c and its fp16 scale and minimum into d and m.
template <class Block>
void affine_rows(int64_t n, int64_t groups, at::Tensor out, Block block) {
  check_rows(out, at::kFloat, n, groups * kBlock, "out");
  float* o = out.data_ptr<float>();
  const int64_t ostride = out.stride(0);
  at::parallel_for(0, n, 16, [&](int64_t r0, int64_t r1) {
    uint8_t c[kBlock];
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        uint16_t dh, mh;
        block(r, g, c, dh, mh);
        const float d = half_to_float(dh), m = half_to_float(mh);
        float* w = o + r * ostride + g * kBlock;
        for (int t = 0; t < kBlock; ++t) w[t] = (float)c[t] * d + m;
      }
    }
  });
}

// Rows of qs (n, row_bytes) with scale and minimum (n, groups) fp16 -> out; codes(row, g, c) writes block g's
// 32 codes of a row of qs into c.
template <class Codes>
void affine_into(const at::Tensor& qs, int64_t row_bytes, int64_t groups, const at::Tensor& scale,
                 const at::Tensor& minimum, at::Tensor out, Codes codes) {
  const int64_t n = qs.size(0);
  check_rows(qs, at::kByte, n, row_bytes, "qs");
  check_rows(scale, at::kHalf, n, groups, "scale");
  check_rows(minimum, at::kHalf, n, groups, "minimum");
  const uint8_t* q = qs.data_ptr<uint8_t>();
  const uint16_t* sp = (const uint16_t*)scale.data_ptr();
  const uint16_t* mp = (const uint16_t*)minimum.data_ptr();
  const int64_t qstride = qs.stride(0), sstride = scale.stride(0), mstride = minimum.stride(0);
  affine_rows(n, groups, out, [&](int64_t r, int64_t g, uint8_t* c, uint16_t& d, uint16_t& m) {
    codes(q + r * qstride, g, c);
    d = sp[r * sstride + g];
    m = mp[r * mstride + g];
  });
}

}  // namespace

// q4 rows: qs (n, k / 2) nibbles in GGUF order, scale / minimum (n, k / 32) fp16 -> out (n, k) fp32
void q4_dequantize_into(const at::Tensor& qs, const at::Tensor& scale, const at::Tensor& minimum, at::Tensor out) {
  const int64_t groups = qs.size(1) * 2 / kBlock;
  affine_into(qs, qs.size(1), groups, scale, minimum, out, [](const uint8_t* row, int64_t g, uint8_t* c) {
    const uint8_t* b = row + g * 16;
    for (int t = 0; t < 16; ++t) {
      c[t] = b[t] & 0x0F;
      c[t + 16] = b[t] >> 4;
    }
  });
}

// rows [start, stop) of q4g or q5g groups (affine_groups.h: qs (N / 16, k / 32 * block bytes), scale / minimum
// (N / 16, k / 32 * 16) fp16, minimum empty for -c d) -> out (stop - start, k) fp32, read where they lie: the
// rows' decoders' bits
template <class L>
void groups_into(const at::Tensor& qs, const at::Tensor& scale, const at::Tensor& minimum, int64_t start,
                 int64_t stop, at::Tensor out) {
  using affine_groups::kRows;
  const int64_t G = qs.size(0), groups = qs.size(1) / L::kBlockBytes;
  check_rows(qs, at::kByte, G, groups * L::kBlockBytes, "qs");
  check_rows(scale, at::kHalf, G, groups * kRows, "scale");
  const bool implied = minimum.numel() == 0;  // Q4_0's and Q5_0's -c d
  if (!implied) check_rows(minimum, at::kHalf, G, groups * kRows, "minimum");
  TORCH_CHECK(qs.is_contiguous() && scale.is_contiguous() && minimum.is_contiguous(), "groups must be contiguous");
  TORCH_CHECK(0 <= start && start <= stop && stop <= G * kRows, "rows [", start, ", ", stop, ") are not in ",
              G * kRows, " rows");
  const uint8_t* q = qs.data_ptr<uint8_t>();
  const uint16_t* sp = (const uint16_t*)scale.data_ptr();
  const uint16_t* mp = implied ? nullptr : (const uint16_t*)minimum.data_ptr();
  affine_rows(stop - start, groups, out, [&](int64_t i, int64_t j, uint8_t* c, uint16_t& d, uint16_t& m) {
    const int64_t r = start + i, g = r / kRows, lane = r % kRows;
    const uint8_t* b = q + (g * groups + j) * L::kBlockBytes;
    for (int t = 0; t < kBlock; ++t) c[t] = (uint8_t)affine_groups::code<L>(b, (int)lane, t);
    d = sp[(g * groups + j) * kRows + lane];
    m = mp ? mp[(g * groups + j) * kRows + lane] : c10::Half(-L::kCentre * half_to_float(d)).x;  // exact: c is 2^k
  });
}

void q4g_dequantize_into(const at::Tensor& qs, const at::Tensor& scale, const at::Tensor& minimum, int64_t start,
                         int64_t stop, at::Tensor out) {
  groups_into<affine_groups::Q4G>(qs, scale, minimum, start, stop, out);
}

void q5g_dequantize_into(const at::Tensor& qs, const at::Tensor& scale, const at::Tensor& minimum, int64_t start,
                         int64_t stop, at::Tensor out) {
  groups_into<affine_groups::Q5G>(qs, scale, minimum, start, stop, out);
}

// q5 rows: qs (n, k / 32 * 20) in affine.h's q5 layout, scale / minimum (n, k / 32) fp16 -> out (n, k) fp32
void q5_dequantize_into(const at::Tensor& qs, const at::Tensor& scale, const at::Tensor& minimum, at::Tensor out) {
  const int64_t groups = qs.size(1) / q5::kBytes;
  auto codes = [groups](const uint8_t* row, int64_t g, uint8_t* c) {
    const uint8_t* b = q5::nibbles(row, g);
    const uint32_t h = q5::fifth_bits(row, groups, g);
    for (int t = 0; t < 16; ++t) {
      c[t] = (b[t] & 0x0F) | ((h >> t) & 1) << 4;
      c[t + 16] = (b[t] >> 4) | ((h >> (t + 16)) & 1) << 4;
    }
  };
  affine_into(qs, groups * q5::kBytes, groups, scale, minimum, out, codes);
}

// q8 rows: qs (n, k) uint8 code + 128, scale (n, k / 32) fp16 -> out (n, k) fp32
void q8_dequantize_into(const at::Tensor& qs, const at::Tensor& scale, at::Tensor out) {
  const int64_t n = qs.size(0), k = qs.size(1), groups = k / kBlock;
  check_rows(qs, at::kByte, n, k, "qs");
  check_rows(scale, at::kHalf, n, groups, "scale");
  check_rows(out, at::kFloat, n, k, "out");
  const uint8_t* q = qs.data_ptr<uint8_t>();
  const uint16_t* sp = (const uint16_t*)scale.data_ptr();
  float* o = out.data_ptr<float>();
  const int64_t qstride = qs.stride(0), sstride = scale.stride(0), ostride = out.stride(0);
  at::parallel_for(0, n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const float d = half_to_float(sp[r * sstride + g]);
        const uint8_t* b = q + r * qstride + g * kBlock;
        float* w = o + r * ostride + g * kBlock;
        for (int t = 0; t < kBlock; ++t) w[t] = (float)(int8_t)(b[t] ^ 0x80) * d;
      }
    }
  });
}

TORCH_LIBRARY_FRAGMENT(pagedeck, lib) {
  lib.def("q4_dequantize_into(Tensor qs, Tensor scale, Tensor minimum, Tensor(a!) out) -> ()", &q4_dequantize_into);
  lib.def("q4g_dequantize_into(Tensor qs, Tensor scale, Tensor minimum, int start, int stop, Tensor(a!) out) -> ()",
          &q4g_dequantize_into);
  lib.def("q5g_dequantize_into(Tensor qs, Tensor scale, Tensor minimum, int start, int stop, Tensor(a!) out) -> ()",
          &q5g_dequantize_into);
  lib.def("q5_dequantize_into(Tensor qs, Tensor scale, Tensor minimum, Tensor(a!) out) -> ()", &q5_dequantize_into);
  lib.def("q8_dequantize_into(Tensor qs, Tensor scale, Tensor(a!) out) -> ()", &q8_dequantize_into);
}

}  // namespace pagedeck
