// run_moves: a load's byte moves out of the mapped file, queued by the Python loader and run here in one call.
//
// The loader walks a GGUF's tensors in Python and hands each matrix's bytes to a C++ repacker, a few hundred
// calls for a 1.5B model. The tokenizer's build, on a thread beside it, holds the GIL for stretches of up to
// ~0.1 s while the tokenizers library builds its maps, and every return of the loader's thread to Python then
// waits for it: loading the weights and the tokenizer side by side took about as long as one after the other.
// Queued, the moves run in one call without the GIL, while the tokenizer builds.
//
// A move is one of the repackers (repack.cpp) on its arguments, or a release: madvise(MADV_DONTNEED) of an
// address range of the file's private, never written map, once the moves before it have read it (the file's
// pages stay in the page cache; the process stops counting them, so the file and its packed copy are not both
// resident). `moved` counts the moved source bytes as the call goes, for the caller's progress reports. `solo`
// runs every move on the calling thread alone (a background move beside a running decode).
#include "common.h"
#include "shared_range.h"

#include <sys/mman.h>

#include <torch/library.h>

namespace pagedeck {

void group_superblocks(const at::Tensor& rows, at::Tensor groups, int64_t block_bytes);
void q8_0_repack(const at::Tensor& raw, at::Tensor qs, at::Tensor scale);
void q5_repack(const at::Tensor& raw, at::Tensor qs, at::Tensor scale, at::Tensor minimum, bool q5_1);
void q4_repack(const at::Tensor& raw, at::Tensor qs, at::Tensor scale, at::Tensor minimum, bool q4_1);

namespace {

// engine/model/packing/move_queue.py's kinds
enum Kind : int64_t { kGroup = 0, kQ8_0 = 1, kQ5 = 2, kCopy = 3, kRelease = 4, kQ4 = 5 };

void copy_bytes(const uint8_t* from, uint8_t* to, int64_t bytes) {
  constexpr int64_t kPiece = 1 << 20;
  shared_range::share_range(0, (bytes + kPiece - 1) / kPiece, 1, [&](int64_t p0, int64_t p1) {
    const int64_t b0 = p0 * kPiece, b1 = std::min(bytes, p1 * kPiece);
    std::memcpy(to + b0, from + b0, b1 - b0);
  });
}

void run_moves(const std::vector<at::Tensor>& src, const std::vector<at::Tensor>& dst,
               const std::vector<at::Tensor>& scale, const std::vector<at::Tensor>& minimum,
               const std::vector<int64_t>& kind, const std::vector<int64_t>& arg, const std::vector<int64_t>& length,
               at::Tensor moved, bool solo) {
  const size_t n = kind.size();
  TORCH_CHECK(src.size() == n && dst.size() == n && scale.size() == n && minimum.size() == n && arg.size() == n &&
                  length.size() == n,
              "run_moves wants one src, dst, scale, minimum, arg and length per move");
  TORCH_CHECK(moved.scalar_type() == at::kLong && moved.numel() == 1 && moved.is_contiguous(),
              "moved must be one int64");
  int64_t* count = moved.data_ptr<int64_t>();
  struct Alone {  // shared_range::solo() for this call, restored however it ends
    bool before = shared_range::solo();
    explicit Alone(bool on) { shared_range::solo() = before || on; }
    ~Alone() { shared_range::solo() = before; }
  } alone(solo);
  for (size_t i = 0; i < n; ++i) {
    switch (kind[i]) {
      case kGroup: group_superblocks(src[i], dst[i], arg[i]); break;
      case kQ8_0: q8_0_repack(src[i], dst[i], scale[i]); break;
      case kQ5: q5_repack(src[i], dst[i], scale[i], minimum[i], arg[i] != 0); break;
      case kQ4: q4_repack(src[i], dst[i], scale[i], minimum[i], arg[i] != 0); break;
      case kCopy:
        TORCH_CHECK(src[i].is_contiguous() && dst[i].is_contiguous() && src[i].nbytes() == dst[i].nbytes(),
                    "a copy wants contiguous tensors of one size");
        copy_bytes(static_cast<const uint8_t*>(src[i].data_ptr()), static_cast<uint8_t*>(dst[i].data_ptr()),
                   (int64_t)src[i].nbytes());
        break;
      case kRelease:  // arg: a page-aligned address, length: its bytes (a whole number of pages)
        madvise(reinterpret_cast<void*>(arg[i]), static_cast<size_t>(length[i]), MADV_DONTNEED);
        continue;
      default: TORCH_CHECK(false, "run_moves: unknown move kind ", kind[i]);
    }
    __atomic_store_n(count, *count + (int64_t)src[i].nbytes(), __ATOMIC_RELAXED);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pagedeck, lib) {
  lib.def("run_moves(Tensor[] src, Tensor(a!)[] dst, Tensor(b!)[] scale, Tensor(c!)[] minimum, int[] kind, "
          "int[] arg, int[] length, Tensor(d!) moved, bool solo=False) -> ()",
          &run_moves);
}

}  // namespace pagedeck
