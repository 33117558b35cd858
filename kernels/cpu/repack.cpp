// Loading GGUF K-quants into the packed matmul formats (kernels/packed.py), in place and in parallel: the
// torch versions (engine/model/ggml_blocks.py + kernels.packed.q8_quantize) built each matrix through several
// whole-tile temporaries (codes, fp32 weights, their abs, sign, floor...), most of an 8B file's load time.
// Every function here computes exactly what those torch versions compute (the tests compare bits):
//   q4_k_repack:   Q4_K super-blocks -> q4 nibbles in GGUF's Q4_0 order, scale = fp16(d * sc), minimum =
//                  fp16(-(dmin * m)) per 32 weights;
//   q8_quantize:   fp32 rows -> Q8_0 as gguf.quants writes it: d = max|w| / 127, code = round-half-away(w * (1/d)),
//                  clamped to +-127, scale fp16(d);
//   q4_to_q8:      q4 rows -> q8 of their exact weights (fused q|k|v whose v is Q6_K: every part becomes q8);
//   group_superblocks / ungroup_superblocks: Q3_K, IQ4_XS, Q4_K, Q5_K or Q6_K rows <-> groups of 16 rows (q4k16.h, q6k16.h), the
//                  same bytes rearranged;
//   q8_group_in_place: q8 rows -> q8g's groups of 16 rows (q8.h), where they lie;
//   q4_group_in_place: q4 rows -> q4g's groups of 16 rows (affine_groups.h), where they lie;
//   centred_minimums: whether q4 or q5 minimums are all -centre * scale (Q4_0, Q5_0: groups leave them out);
//   q6_k_to_q8:    Q6_K super-blocks decoded exactly (w = (d * sc) * (q - 32), gguf's order of operations) and
//                  quantized as q8_quantize does, with no fp32 matrix in between.
//   q8_0_repack:   Q8_0 blocks -> q8 (the file's codes + 128 and its scales: exact);
//   q5_repack:     Q5_0 / Q5_1 blocks -> q5 (kernels.packed.q5_layout's order, d and m or -16 d: exact);
//   q4_repack:     Q4_0 / Q4_1 blocks -> q4 (the file's nibble bytes, d and m or -8 d: exact).
// The last three are the loader's one pass over Q8_0, Q5_0 / Q5_1 and Q4_0 / Q4_1 blocks (a Gemma-3-270M-like
// file's embedding and projections, a Q8_0 or Q4_0 file's every matrix), where torch's route (views, masks,
// copies per tile) took most of the load. Every function splits its work with shared_range (the calling thread and helpers as they get a
// core), not OpenMP's fork and join: the load runs beside the tokenizer's thread and, in the many-model server,
// beside a serving model, and a join per ~1 MB tile waited on busy cores.
#include "common.h"
#include "iq4xs16.h"
#include "affine_groups.h"
#include "q4k16.h"
#include "q5k16.h"
#include "q6k16.h"
#include "q3k16.h"
#include "q8.h"
#include "shared_range.h"

#include <torch/library.h>

namespace pagedeck {
namespace {

constexpr int64_t kSuper = 256;

inline uint16_t to_half(float f) { return c10::Half(f).x; }  // round to nearest even, as torch's .half()

// one 32-weight block of fp32 weights -> 32 int8 codes + fp16 scale (kernels.packed.q8_quantize's rule)
inline void q8_block(const float* w, int8_t* codes, uint16_t* scale) {
  float amax = 0.0f;
  for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(w[i]));
  const float d = amax / 127.0f;
  const float inv = d > 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < kBlock; ++i) {
    const float q = w[i] * inv;
    float r = std::floor(std::fabs(q) + 0.5f);
    r = std::min(r, 127.0f);
    codes[i] = (int8_t)(q < 0.0f ? -r : r);
  }
  *scale = to_half(d);
}

void check_u8(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kByte && t.is_contiguous(), name, " must be contiguous uint8");
}

void check_half(const at::Tensor& t, int64_t numel, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kHalf && t.is_contiguous() && t.numel() == numel, name,
              " must be contiguous fp16 of ", numel, " values");
}

}  // namespace

// raw (n, k / 256 * 144) Q4_K bytes -> qs (n, k / 2), scale and minimum (n, k / 32), written in place
void q4_k_repack(const at::Tensor& raw, at::Tensor qs, at::Tensor scale, at::Tensor minimum) {
  check_u8(raw, "raw");
  check_u8(qs, "qs");
  const int64_t supers = raw.numel() / 144;
  TORCH_CHECK(raw.numel() == supers * 144 && qs.numel() == supers * 128, "Q4_K sizes do not match");
  check_half(scale, supers * 8, "scale");
  check_half(minimum, supers * 8, "minimum");
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* dst = qs.data_ptr<uint8_t>();
  uint16_t* sp = (uint16_t*)scale.data_ptr();
  uint16_t* mp = (uint16_t*)minimum.data_ptr();
  shared_range::share_range(0, supers, 1024, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const uint8_t* b = src + s * 144;
      uint16_t dh, mh;
      std::memcpy(&dh, b, 2);
      std::memcpy(&mh, b + 2, 2);
      const float d = half_to_float(dh), dmin = half_to_float(mh);
      const uint8_t* sc = b + 4;  // 12 bytes: eight 6-bit scales and mins
      for (int j = 0; j < 8; ++j) {
        int s6, m6;
        if (j < 4) {
          s6 = sc[j] & 0x3F;
          m6 = sc[j + 4] & 0x3F;
        } else {
          s6 = (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 2) & 0x30);
          m6 = (sc[j + 4] >> 4) | ((sc[j] >> 2) & 0x30);
        }
        sp[s * 8 + j] = to_half(d * (float)s6);
        mp[s * 8 + j] = to_half(-(dmin * (float)m6));
      }
      // 4 runs of 32 bytes: low nibbles are sub-block 2i's weights 0..31, high nibbles sub-block 2i+1's
      const uint8_t* q = b + 16;
      uint8_t* o = dst + s * 128;
      for (int i = 0; i < 4; ++i) {
        const uint8_t* run = q + 32 * i;
        uint8_t* lo = o + 32 * i;  // sub-block 2i: byte t = code t | code t+16 << 4
        uint8_t* hi = lo + 16;
        for (int t = 0; t < 16; ++t) {
          lo[t] = (uint8_t)((run[t] & 0x0F) | ((run[t + 16] & 0x0F) << 4));
          hi[t] = (uint8_t)((run[t] >> 4) | (run[t + 16] & 0xF0));
        }
      }
    }
  });
}

// w (n, k) fp32 -> codes (n, k) written as uint8 code + 128 when `biased` (the kernel's form) else as int8 bits,
// scale (n, k / 32) fp16
void q8_quantize_into(const at::Tensor& w, at::Tensor codes, at::Tensor scale, bool biased) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.is_contiguous() && w.numel() % kBlock == 0,
              "w must be contiguous fp32 in blocks of 32");
  const int64_t blocks = w.numel() / kBlock;
  TORCH_CHECK(codes.is_contiguous() && codes.element_size() == 1 && codes.numel() == w.numel(), "codes size");
  check_half(scale, blocks, "scale");
  const float* src = w.data_ptr<float>();
  int8_t* cp = (int8_t*)codes.data_ptr();
  uint16_t* sp = (uint16_t*)scale.data_ptr();
  shared_range::share_range(0, blocks, 4096, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      q8_block(src + b * kBlock, cp + b * kBlock, sp + b);
      if (biased)
        for (int i = 0; i < kBlock; ++i) cp[b * kBlock + i] = (int8_t)((uint8_t)cp[b * kBlock + i] ^ 0x80);
    }
  });
}

// raw (n, k / 256 * 210) Q6_K bytes -> qs (n, k) uint8 code + 128, scale (n, k / 32) fp16, in place
void q6_k_to_q8(const at::Tensor& raw, at::Tensor qs, at::Tensor scale) {
  check_u8(raw, "raw");
  check_u8(qs, "qs");
  const int64_t supers = raw.numel() / 210;
  TORCH_CHECK(raw.numel() == supers * 210 && qs.numel() == supers * kSuper, "Q6_K sizes do not match");
  check_half(scale, supers * 8, "scale");
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* dst = qs.data_ptr<uint8_t>();
  uint16_t* sp = (uint16_t*)scale.data_ptr();
  shared_range::share_range(0, supers, 512, [&](int64_t s0, int64_t s1) {
    float w[kSuper];
    for (int64_t s = s0; s < s1; ++s) {
      const uint8_t *ql = src + s * 210, *qh = ql + 128;
      const int8_t* sc = (const int8_t*)(ql + 192);
      uint16_t dh;
      std::memcpy(&dh, ql + 208, 2);
      const float d = half_to_float(dh);
      for (int h = 0; h < 2; ++h) {
        for (int g = 0; g < 4; ++g) {
          for (int part = 0; part < 2; ++part) {  // 16 weights share one scale
            const int i0 = h * 128 + g * 32 + part * 16;
            const float scl = d * (float)sc[i0 / 16];
            const uint8_t* lp = ql + h * 64 + (g & 1) * 32 + part * 16;
            const uint8_t* hp = qh + h * 32 + part * 16;
            const int shift = g < 2 ? 0 : 4;
            for (int l = 0; l < 16; ++l) {
              const int code = ((lp[l] >> shift) & 0x0F) | (((hp[l] >> (2 * g)) & 3) << 4);
              w[i0 + l] = scl * (float)(code - 32);
            }
          }
        }
      }
      for (int j = 0; j < 8; ++j) {
        int8_t* c = (int8_t*)dst + s * kSuper + j * kBlock;
        q8_block(w + j * kBlock, c, sp + s * 8 + j);
        for (int i = 0; i < kBlock; ++i) c[i] = (int8_t)((uint8_t)c[i] ^ 0x80);
      }
    }
  });
}

// q4 rows (qs (n, k / 2), scale and minimum (n, k / 32) fp16) -> q8 of their exact weights, w = code * scale +
// minimum rounded after the product and after the sum (kernels.packed.q4_dequantize's two torch ops, never an
// fma), quantized as q8_quantize does: qs8 (n, k) uint8 code + 128, scale8 (n, k / 32) fp16
void q4_to_q8(const at::Tensor& qs, const at::Tensor& scale, const at::Tensor& minimum, at::Tensor qs8,
              at::Tensor scale8) {
  check_u8(qs, "qs");
  check_u8(qs8, "qs8");
  const int64_t blocks = qs.numel() / 16;
  TORCH_CHECK(qs8.numel() == blocks * kBlock, "q4 -> q8 sizes do not match");
  TORCH_CHECK(scale.scalar_type() == at::kHalf && minimum.scalar_type() == at::kHalf && scale.is_contiguous() &&
                  minimum.is_contiguous() && scale.numel() == blocks && minimum.numel() == blocks,
              "scale and minimum must be contiguous fp16, one per block");
  check_half(scale8, blocks, "scale8");
  const uint8_t* src = qs.data_ptr<uint8_t>();
  const uint16_t *sp = (const uint16_t*)scale.data_ptr(), *mp = (const uint16_t*)minimum.data_ptr();
  int8_t* dst = (int8_t*)qs8.data_ptr();
  uint16_t* op = (uint16_t*)scale8.data_ptr();
  shared_range::share_range(0, blocks, 4096, [&](int64_t b0, int64_t b1) {
    float w[kBlock];
    for (int64_t b = b0; b < b1; ++b) {
      const float s = half_to_float(sp[b]), m = half_to_float(mp[b]);
      for (int i = 0; i < kBlock; ++i) {
        const uint8_t byte = src[b * 16 + (i & 15)];
        float p = (float)(i < 16 ? (byte & 0x0F) : (byte >> 4)) * s;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
        asm volatile("" : "+x"(p));  // keeps the product rounded on its own: no fma with the sum
#else
        volatile float keep = p;
        p = keep;
#endif
        w[i] = p + m;
      }
      int8_t* c = dst + b * kBlock;
      q8_block(w, c, op + b);
      for (int i = 0; i < kBlock; ++i) c[i] = (int8_t)((uint8_t)c[i] ^ 0x80);
    }
  });
}

// rows (n, k / 256 * B) super-blocks <-> groups of 16 rows (n / 16, k / 256 * 16 B): B = 110 (Q3_K, q3k16.h), 136
// (IQ4_XS, iq4xs16.h), 144 (Q4_K, q4k16.h), 176 (Q5_K, q5k16.h) or 210 (Q6_K, q6k16.h); one group a task, either way (Pack: rows ->
// groups)
template <bool Pack>
void move_groups(const at::Tensor& rows, const at::Tensor& groups, int64_t block_bytes) {
  check_u8(rows, "rows");
  check_u8(groups, "groups");
  TORCH_CHECK(block_bytes == q4k::kBytes || block_bytes == q6::kBytes || block_bytes == q4k::Q5K::kBytes ||
                  block_bytes == lut4::Iq4xs::kBytes || block_bytes == q3k::kBytes,
              "groups of 16 rows hold Q3_K (110-byte), IQ4_XS (136-byte), Q4_K (144-byte), Q5_K (176-byte) or Q6_K "
              "(210-byte) super-blocks, not ", block_bytes, "-byte ones");
  const int64_t n = rows.size(0), row_bytes = rows.size(1), group_bytes = row_bytes * q4k16::kRows;
  TORCH_CHECK(rows.dim() == 2 && row_bytes % block_bytes == 0 && n % q4k16::kRows == 0 && groups.dim() == 2 &&
                  groups.size(0) == n / q4k16::kRows && groups.size(1) == group_bytes,
              "groups of 16 rows want (n / 16, 16 x row bytes) for rows (n, row bytes), n a multiple of 16");
  uint8_t *r = (uint8_t*)rows.data_ptr(), *g = (uint8_t*)groups.data_ptr();
  const auto move = block_bytes == q6::kBytes           ? row_groups::move_group<Pack, q6k16::Group>
                    : block_bytes == q3k::kBytes        ? row_groups::move_group<Pack, q3k16::Group>
                    : block_bytes == q4k::kBytes        ? row_groups::move_group<Pack, q4k16::Group>
                    : block_bytes == lut4::Iq4xs::kBytes ? row_groups::move_group<Pack, iq4xs16::Group>
                                                        : row_groups::move_group<Pack, q5k16::Group>;
  shared_range::share_range(0, groups.size(0), 1, [&](int64_t g0, int64_t g1) {
    // Pack: a group's 16 rows (contiguous) copied first: read from the mapped file, the gathers across 16 rows
    // faulted its pages in 2.1 GB/s where one sequential copy and gathers from cache run ~2x that
    std::vector<uint8_t> buf(Pack ? group_bytes : 0);
    for (int64_t i = g0; i < g1; ++i) {
      uint8_t* src = r + i * group_bytes;
      if (Pack) src = (uint8_t*)std::memcpy(buf.data(), src, group_bytes);
      move(src, row_bytes, row_bytes / block_bytes, g + i * group_bytes);
    }
  });
}

void group_superblocks(const at::Tensor& rows, at::Tensor groups, int64_t block_bytes) {
  move_groups<true>(rows, groups, block_bytes);
}

void ungroup_superblocks(const at::Tensor& groups, at::Tensor rows, int64_t block_bytes) {
  move_groups<false>(rows, groups, block_bytes);
}

// q8 rows (qs (N, K) uint8, scale (N, K/32) fp16) regrouped into q8g groups in place (q8.h); the caller then
// views them as (N/16, K/32 * 512) and (N/16, K/32 * 16).
void q8_group_in_place(at::Tensor qs, at::Tensor scale) {
  const int64_t n = qs.size(0), k = qs.size(1), nb = k / kBlock;
  TORCH_CHECK(qs.dim() == 2 && qs.is_contiguous() && qs.scalar_type() == at::kByte && k % kBlock == 0 &&
                  n % q8g::kRows == 0 && scale.is_contiguous() && scale.scalar_type() == at::kHalf &&
                  scale.dim() == 2 && scale.size(0) == n && scale.size(1) == nb,
              "q8_group_in_place takes q8 rows: qs (N, K) uint8 with N % 16 == 0 and scale (N, K/32) fp16");
  uint8_t* q = qs.data_ptr<uint8_t>();
  uint16_t* d = (uint16_t*)scale.data_ptr();
  shared_range::share_range(0, n / q8g::kRows, 16, [&](int64_t g0, int64_t g1) {
    std::vector<uint8_t> tmp(q8g::kRows * k);
    std::vector<uint16_t> tmp_scales(q8g::kRows * nb);
    for (int64_t g = g0; g < g1; ++g)
      q8g::group_in_place(q + g * q8g::kRows * k, d + g * q8g::kRows * nb, nb, tmp.data(), tmp_scales.data());
  });
}

// q4 rows (qs (N, K/2) uint8, scale and minimum (N, K/32) fp16) regrouped into q4g groups in place (affine_groups.h); the
// caller then views them as (N/16, K/32 * 256) and (N/16, K/32 * 16).
void q4_group_in_place(at::Tensor qs, at::Tensor scale, at::Tensor minimum) {
  const int64_t n = qs.size(0), nb = qs.size(1) / 16;
  auto rows_of_scales = [&](const at::Tensor& t) {
    return t.is_contiguous() && t.scalar_type() == at::kHalf && t.dim() == 2 && t.size(0) == n && t.size(1) == nb;
  };
  TORCH_CHECK(qs.dim() == 2 && qs.is_contiguous() && qs.scalar_type() == at::kByte && qs.size(1) == nb * 16 &&
                  n % affine_groups::kRows == 0 && rows_of_scales(scale) && rows_of_scales(minimum),
              "q4_group_in_place takes q4 rows: qs (N, K/2) uint8 with N % 16 == 0, scale and minimum (N, K/32) fp16");
  uint8_t* q = qs.data_ptr<uint8_t>();
  uint16_t *d = (uint16_t*)scale.data_ptr(), *m = (uint16_t*)minimum.data_ptr();
  shared_range::share_range(0, n / affine_groups::kRows, 16, [&](int64_t g0, int64_t g1) {
    std::vector<uint8_t> tmp(affine_groups::kRows * nb * 16);
    std::vector<uint16_t> tmp_s(2 * affine_groups::kRows * nb);
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t at = g * affine_groups::kRows * nb;
      affine_groups::group_in_place(q + at * 16, d + at, m + at, nb, tmp.data(), tmp_s.data());
    }
  });
}

// Whether every minimum is -centre * scale (what GGUF Q4_0 and Q5_0 blocks hold), compared as floats as
// torch.equal does: such groups leave their minimums out (affine_groups.h). A Q4_1 or Q5_1 matrix stops at its
// first block; a Q4_0 one is read once, at the memory's speed (torch's float copies added ~0.1 s to a 1.5B load).
bool centred_minimums(const at::Tensor& scale, const at::Tensor& minimum, double centre) {
  TORCH_CHECK(scale.scalar_type() == at::kHalf && minimum.scalar_type() == at::kHalf && scale.is_contiguous() &&
                  minimum.is_contiguous() && scale.sizes() == minimum.sizes(),
              "centred_minimums takes contiguous fp16 scales and minimums of one shape");
  const uint16_t *d = (const uint16_t*)scale.data_ptr(), *m = (const uint16_t*)minimum.data_ptr();
  const float c = (float)centre;
  std::atomic<bool> centred{true};
  shared_range::share_range(0, scale.numel(), 1 << 16, [&](int64_t i0, int64_t i1) {
    if (!centred.load(std::memory_order_relaxed)) return;
    bool ok = true;
    for (int64_t i = i0; i < i1; ++i) ok &= half_to_float(m[i]) == -c * half_to_float(d[i]);
    if (!ok) centred.store(false, std::memory_order_relaxed);
  });
  return centred.load();
}

// raw (n, k / 32 * 34) Q8_0 blocks -> qs (n, k) = code + 128 and scale (n, k / 32), the file's own values
void q8_0_repack(const at::Tensor& raw, at::Tensor qs, at::Tensor scale) {
  check_u8(raw, "raw");
  check_u8(qs, "qs");
  constexpr int64_t kIn = 2 + kBlock;
  const int64_t blocks = raw.numel() / kIn;
  TORCH_CHECK(raw.numel() == blocks * kIn && qs.numel() == blocks * kBlock, "Q8_0 sizes do not match");
  check_half(scale, blocks, "scale");
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* dst = qs.data_ptr<uint8_t>();
  uint16_t* sp = (uint16_t*)scale.data_ptr();
  shared_range::share_range(0, blocks, 8192, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* in = src + b * kIn;
      std::memcpy(sp + b, in, 2);
      uint8_t* out = dst + b * kBlock;
      for (int i = 0; i < kBlock; ++i) out[i] = in[2 + i] ^ 0x80;
    }
  });
}

// raw (n, nb * 22) Q5_0 or (n, nb * 24) Q5_1 blocks -> q5's qs (n, nb * 20), scale = d and minimum = m (Q5_1) or
// fp16(-16 d) (Q5_0) (n, nb): each pair of blocks' nibbles, then their fifth bits as 16-bit words [j low,
// j+1 low, j high, j+1 high]; an odd last block's nibbles and bits as they are (kernels.packed.q5_layout)
// raw Q4_0 (18 bytes: d, 16 nibble bytes) or Q4_1 (20: d, m, nibbles) blocks -> qs (n, nb * 16), the file's nibble
// bytes in its order, scale and minimum (n * nb) fp16: d, and m or -8 d (exact in fp16 but past |d| = 8188, where
// torch's fp16 product overflows to infinity as this does)
// The per-32 affine repackers' tensors, checked: raw blocks of in_bytes -> qs (n, nb * out_bytes) codes and
// scale, minimum (n * nb) fp16
struct AffineMove {
  const uint8_t* src;
  uint8_t* dst;
  uint16_t *sp, *mp;
  int64_t n, nb;
};

AffineMove affine_move(const at::Tensor& raw, at::Tensor& qs, at::Tensor& scale, at::Tensor& minimum,
                       int64_t out_bytes, int64_t in_bytes, const char* type) {
  check_u8(raw, "raw");
  check_u8(qs, "qs");
  TORCH_CHECK(qs.dim() == 2 && qs.size(1) % out_bytes == 0, "qs must be (n, nb * ", out_bytes, ")");
  const int64_t n = qs.size(0), nb = qs.size(1) / out_bytes;
  TORCH_CHECK(raw.numel() == n * nb * in_bytes, type, " sizes do not match");
  check_half(scale, n * nb, "scale");
  check_half(minimum, n * nb, "minimum");
  return {raw.data_ptr<uint8_t>(), qs.data_ptr<uint8_t>(), (uint16_t*)scale.data_ptr(), (uint16_t*)minimum.data_ptr(),
          n, nb};
}

void q4_repack(const at::Tensor& raw, at::Tensor qs, at::Tensor scale, at::Tensor minimum, bool q4_1) {
  const int64_t head = q4_1 ? 4 : 2, in_bytes = head + 16;
  const AffineMove mv = affine_move(raw, qs, scale, minimum, 16, in_bytes, "Q4");
  shared_range::share_range(0, mv.n * mv.nb, 8192, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* in = mv.src + b * in_bytes;
      std::memcpy(mv.sp + b, in, 2);
      if (q4_1) {
        std::memcpy(mv.mp + b, in + 2, 2);
      } else {
        uint16_t d;
        std::memcpy(&d, in, 2);
        mv.mp[b] = to_half(-8.0f * half_to_float(d));
      }
      std::memcpy(mv.dst + b * 16, in + head, 16);
    }
  });
}

void q5_repack(const at::Tensor& raw, at::Tensor qs, at::Tensor scale, at::Tensor minimum, bool q5_1) {
  constexpr int64_t kOut = 20;
  const int64_t head = q5_1 ? 4 : 2, in_bytes = head + 20;
  const AffineMove mv = affine_move(raw, qs, scale, minimum, kOut, in_bytes, "Q5");
  const uint8_t* src = mv.src;
  uint8_t* dst = mv.dst;
  uint16_t *sp = mv.sp, *mp = mv.mp;
  const int64_t n = mv.n, nb = mv.nb;
  shared_range::share_range(0, n, std::max<int64_t>(1, 4096 / nb), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t j = 0; j < nb; ++j) {
        const uint8_t* in = src + (r * nb + j) * in_bytes;
        const int64_t at = r * nb + j;
        std::memcpy(sp + at, in, 2);
        if (q5_1) {
          std::memcpy(mp + at, in + 2, 2);
        } else {
          uint16_t d;
          std::memcpy(&d, in, 2);
          mp[at] = to_half(-16.0f * half_to_float(d));
        }
      }
      const uint8_t* row = src + r * nb * in_bytes;
      uint8_t* out = dst + r * nb * kOut;
      int64_t j = 0;
      for (; j + 2 <= nb; j += 2, out += 2 * kOut) {
        const uint8_t *a = row + j * in_bytes + head, *b = a + in_bytes;  // qh (4 bytes), then 16 nibble bytes
        std::memcpy(out, a + 4, 16);
        std::memcpy(out + 16, b + 4, 16);
        std::memcpy(out + 32, a, 2);
        std::memcpy(out + 34, b, 2);
        std::memcpy(out + 36, a + 2, 2);
        std::memcpy(out + 38, b + 2, 2);
      }
      if (j < nb) {
        const uint8_t* a = row + j * in_bytes + head;
        std::memcpy(out, a + 4, 16);
        std::memcpy(out + 16, a, 4);
      }
    }
  });
}

TORCH_LIBRARY_FRAGMENT(pagedeck, lib) {
  lib.def("q8_group_in_place(Tensor(a!) qs, Tensor(b!) scale) -> ()", &q8_group_in_place);
  lib.def("q4_group_in_place(Tensor(a!) qs, Tensor(b!) scale, Tensor(c!) minimum) -> ()", &q4_group_in_place);
  lib.def("centred_minimums(Tensor scale, Tensor minimum, float centre) -> bool", &centred_minimums);
  lib.def("group_superblocks(Tensor rows, Tensor(a!) groups, int block_bytes) -> ()", &group_superblocks);
  lib.def("ungroup_superblocks(Tensor groups, Tensor(a!) rows, int block_bytes) -> ()", &ungroup_superblocks);
  lib.def("q4_to_q8(Tensor qs, Tensor scale, Tensor minimum, Tensor(a!) qs8, Tensor(b!) scale8) -> ()", &q4_to_q8);
  lib.def("q4_k_repack(Tensor raw, Tensor(a!) qs, Tensor(b!) scale, Tensor(c!) minimum) -> ()", &q4_k_repack);
  lib.def("q8_quantize_into(Tensor w, Tensor(a!) codes, Tensor(b!) scale, bool biased) -> ()", &q8_quantize_into);
  lib.def("q6_k_to_q8(Tensor raw, Tensor(a!) qs, Tensor(b!) scale) -> ()", &q6_k_to_q8);
  lib.def("q8_0_repack(Tensor raw, Tensor(a!) qs, Tensor(b!) scale) -> ()", &q8_0_repack);
  lib.def("q4_repack(Tensor raw, Tensor(a!) qs, Tensor(b!) scale, Tensor(c!) minimum, bool q4_1) -> ()", &q4_repack);
  lib.def("q5_repack(Tensor raw, Tensor(a!) qs, Tensor(b!) scale, Tensor(c!) minimum, bool q5_1) -> ()", &q5_repack);
}

}  // namespace pagedeck
