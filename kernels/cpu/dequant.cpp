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

#include <cstring>
#include <utility>

namespace pagedeck {
namespace {

void check_rows(const at::Tensor& t, at::ScalarType type, int64_t n, int64_t cols, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.dim() == 2 && t.size(0) == n && t.size(1) == cols &&
                  t.stride(1) == 1,
              name, " must be (", n, ", ", cols, ") rows with unit column stride");
}

// One block of an affine format: w[i] = code_i * d + m, code_i = nibble i of its 16 bytes (GGUF order: low
// nibbles weights 0..15, high ones 16..31) plus 16 where bit i of `fifth` is set (q5). code * d is exact in
// fp32, so one fma gives "* scale + minimum"'s bits. A prompt chunk of a model without an fp32 copy decodes
// every matrix through here (the default model's layers: ~120 ms a chunk one code at a time, ~20 vectorized).
inline void decode32(const uint8_t* nib, uint32_t fifth, float d, float m, float* w) {
#if defined(PD_AVX512)
  const __m128i bytes = _mm_loadu_si128((const __m128i*)nib), low = _mm_set1_epi8(0x0F);
  const __m512i sixteen = _mm512_set1_epi32(16);
  __m512i lo = _mm512_cvtepu8_epi32(_mm_and_si128(bytes, low));
  __m512i hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(bytes, 4), low));
  lo = _mm512_mask_add_epi32(lo, (__mmask16)(fifth & 0xFFFF), lo, sixteen);
  hi = _mm512_mask_add_epi32(hi, (__mmask16)(fifth >> 16), hi, sixteen);
  const __m512 vd = _mm512_set1_ps(d), vm = _mm512_set1_ps(m);
  _mm512_storeu_ps(w, _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), vd, vm));
  _mm512_storeu_ps(w + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), vd, vm));
#elif defined(PD_AVX2)
  const __m128i bytes = _mm_loadu_si128((const __m128i*)nib), low = _mm_set1_epi8(0x0F);
  const __m128i halves[2] = {_mm_and_si128(bytes, low), _mm_and_si128(_mm_srli_epi16(bytes, 4), low)};
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128), sixteen = _mm256_set1_epi32(16);
  const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
  for (int q = 0; q < 4; ++q) {  // weights 8q..8q+7: bytes 8 (q % 2).. of the low (q < 2) or high nibbles
    const __m128i h = halves[q / 2];
    __m256i c = _mm256_cvtepu8_epi32(q % 2 ? _mm_unpackhi_epi64(h, h) : h);
    const __m256i f = _mm256_and_si256(_mm256_set1_epi32((int)(fifth >> (8 * q))), bit);
    c = _mm256_add_epi32(c, _mm256_and_si256(_mm256_cmpeq_epi32(f, bit), sixteen));
    _mm256_storeu_ps(w + 8 * q, _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), vd, vm));
  }
#else
  for (int i = 0; i < 16; ++i) {
    w[i] = (float)((nib[i] & 15) | ((fifth >> i) & 1) << 4) * d + m;
    w[i + 16] = (float)((nib[i] >> 4) | ((fifth >> (i + 16)) & 1) << 4) * d + m;
  }
#endif
}

// n rows of an affine format -> out (n, groups * 32) fp32; block(r, g) gives row r's block g as its 16 nibble
// bytes, fifth bits (0 for q4), scale and minimum: {nib, fifth, d, m}.
struct Block {
  const uint8_t* nib;
  uint32_t fifth;
  float d, m;
};

template <class Of>
void affine_rows(int64_t n, int64_t groups, at::Tensor out, Of block) {
  check_rows(out, at::kFloat, n, groups * kBlock, "out");
  float* o = out.data_ptr<float>();
  const int64_t ostride = out.stride(0);
  at::parallel_for(0, n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        uint8_t gathered[16];  // a group's row: its 4 nibble words gathered here
        const Block b = block(r, g, gathered);
        decode32(b.nib, b.fifth, b.d, b.m, o + r * ostride + g * kBlock);
      }
  });
}

// Rows of qs (n, row_bytes) with scale and minimum (n, groups) fp16 -> out; at(row, g) gives block g's nibble
// bytes and fifth bits in a row of qs.
template <class At>
void affine_into(const at::Tensor& qs, int64_t row_bytes, int64_t groups, const at::Tensor& scale,
                 const at::Tensor& minimum, at::Tensor out, At at) {
  const int64_t n = qs.size(0);
  check_rows(qs, at::kByte, n, row_bytes, "qs");
  check_rows(scale, at::kHalf, n, groups, "scale");
  check_rows(minimum, at::kHalf, n, groups, "minimum");
  const uint8_t* q = qs.data_ptr<uint8_t>();
  const uint16_t* sp = (const uint16_t*)scale.data_ptr();
  const uint16_t* mp = (const uint16_t*)minimum.data_ptr();
  const int64_t qstride = qs.stride(0), sstride = scale.stride(0), mstride = minimum.stride(0);
  affine_rows(n, groups, out, [&](int64_t r, int64_t g, uint8_t*) {
    const auto [nib, fifth] = at(q + r * qstride, g);
    return Block{nib, fifth, half_to_float(sp[r * sstride + g]), half_to_float(mp[r * mstride + g])};
  });
}

}  // namespace

// q4 rows: qs (n, k / 2) nibbles in GGUF order, scale / minimum (n, k / 32) fp16 -> out (n, k) fp32
void q4_dequantize_into(const at::Tensor& qs, const at::Tensor& scale, const at::Tensor& minimum, at::Tensor out) {
  const int64_t groups = qs.size(1) * 2 / kBlock;
  affine_into(qs, qs.size(1), groups, scale, minimum, out,
              [](const uint8_t* row, int64_t g) { return std::pair<const uint8_t*, uint32_t>(row + g * 16, 0); });
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
  affine_rows(stop - start, groups, out, [&](int64_t i, int64_t j, uint8_t* gathered) {
    const int64_t r = start + i, g = r / kRows, lane = r % kRows, at = (g * groups + j) * kRows + lane;
    const uint8_t* b = q + (g * groups + j) * L::kBlockBytes;
    for (int t = 0; t < 4; ++t) std::memcpy(gathered + 4 * t, b + 64 * t + 4 * lane, 4);
    uint32_t fifth = 0;
    if constexpr (L::kFive) std::memcpy(&fifth, b + 256 + 4 * lane, 4);
    const float d = half_to_float(sp[at]);
    return Block{gathered, fifth, d, mp ? half_to_float(mp[at]) : -L::kCentre * d};  // exact: c is a power of 2
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
  affine_into(qs, groups * q5::kBytes, groups, scale, minimum, out, [groups](const uint8_t* row, int64_t g) {
    return std::pair<const uint8_t*, uint32_t>(q5::nibbles(row, g), q5::fifth_bits(row, groups, g));
  });
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
