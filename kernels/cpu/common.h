// Shared helpers of pagedeck's CPU kernels (built at first use by kernels/cpu_ext.py with -march=native); the
// instruction-set switches and vector primitives are isa.h's.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "isa.h"

namespace pagedeck {

constexpr int64_t kBlock = 32;  // quantization block (GGUF's QK4_x / QK8_0)

// How far ahead (bytes of weight codes) the per-row kernels prefetch their weight stream. The hardware
// prefetchers alone left one core's row kernel at ~11.5 GB/s from DRAM where the same kernel runs ~20 GB/s
// from cache; 1-3 KB ahead gave 15.5-17 GB/s per core (2048 and 3072 alike; 1024 a little less, 4096 less).
constexpr int64_t kPrefetch = 2048;

inline void check_cpu_f32(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), name,
              " must be a contiguous float32 CPU tensor");
}

}  // namespace pagedeck
