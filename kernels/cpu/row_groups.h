// What the 16-row grouped formats (q4k16.h, q5k16.h, q6k16.h, q3k16.h, iq4xs16.h) share: moving a group's
// super-blocks between the file's row order and the group's interleaved layout, and the portable fallback that
// runs each row of a group through the rows' own kernel. Each format describes its layout as a struct G with kBytes (a row's super-block),
// kGroupBytes (16 of them, interleaved), kRuns (the super-block's byte ranges, each moved `unit` bytes at a time)
// and at(r, i) (the group byte holding byte i of row r's super-block; a run's unit u puts row r at at(0, i) + u r).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common.h"

namespace pagedeck {
namespace row_groups {

constexpr int kRows = 16;

struct Run {
  int start, end, unit;  // bytes [start, end) of a row's super-block, moved `unit` bytes at a time
};

// row-ordered super-blocks <-> one group's (Pack: rows -> group); `rows` points at row 0, rows row_bytes apart
template <bool Pack, class G>
inline void move_group(uint8_t* rows, int64_t row_bytes, int64_t nsb, uint8_t* grp) {
#ifdef PD_AVX512
  // the loader's direction: each 64-byte line of 4-byte words is one gather of word i from the 16 rows (the
  // word-by-word copies below took ~0.5 s of a 1.1 GB file's load)
  if constexpr (Pack) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int32_t)row_bytes));
    // byte runs (q6k16's scales, at(r, i + q) = at(0, i) + 16 q + r): within each 128-bit lane (rows 4l..4l+3)
    // the words' bytes regrouped byte q first, then dword q * 4 + l <- l * 4 + q
    const __m512i by_byte = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    const __m512i by_row = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (int64_t s = 0; s < nsb; ++s) {
      uint8_t* sb = rows + s * G::kBytes;
      uint8_t* o = grp + s * G::kGroupBytes;
      for (const Run& run : G::kRuns)
        for (int i = run.start; i < run.end; i += run.unit) {
          if (run.unit == 4) {
            _mm512_storeu_si512(o + G::at(0, i), _mm512_i32gather_epi32(idx, sb + i, 1));
            continue;
          }
          if (run.unit == 1 && (run.end - i) % 4 == 0) {  // bytes i..i+3 of the rows, each byte's 16 side by side
            const __m512i w = _mm512_shuffle_epi8(_mm512_i32gather_epi32(idx, sb + i, 1), by_byte);
            _mm512_storeu_si512(o + G::at(0, i), _mm512_permutexvar_epi32(by_row, w));
            i += 3;
            continue;
          }
          for (int r = 0; r < kRows; ++r) std::memcpy(o + G::at(r, i), sb + r * row_bytes + i, run.unit);
        }
    }
    return;
  }
#endif
  for (int64_t s = 0; s < nsb; ++s)
    for (int r = 0; r < kRows; ++r) {
      uint8_t* sb = rows + r * row_bytes + s * G::kBytes;
      uint8_t* o = grp + s * G::kGroupBytes;
      for (const Run& run : G::kRuns)
        for (int i = run.start; i < run.end; i += run.unit)
          Pack ? std::memcpy(o + G::at(r, i), sb + i, run.unit) : std::memcpy(sb + i, o + G::at(r, i), run.unit);
    }
}

// row r's super-block from one group super-block g
template <class G>
inline void unpack_super(const uint8_t* g, int r, uint8_t* sb) {
  for (int i = 0; i < G::kBytes; ++i) sb[i] = g[G::at(r, i)];
}

// the 16 rows of group super-blocks grp.. (nsb of them) in row order, into rows (16 x nsb super-blocks)
template <class G>
inline void group_to_rows(const uint8_t* grp, int64_t nsb, std::vector<uint8_t>& rows) {
  rows.resize(kRows * nsb * G::kBytes);
  move_group<false, G>(rows.data(), nsb * G::kBytes, nsb, const_cast<uint8_t*>(grp));
}

// out[m * 16 + r] = row_kernel(row r's super-blocks, col)[m] for M activation rows: each row of a group through
// the rows' kernel (row_kernel(row, col) fills col[0..M)), for builds without the group kernel
template <class G, class Fn>
inline void each_row(const uint8_t* grp, int64_t nsb, int64_t M, float* out, Fn&& row_kernel) {
  thread_local std::vector<uint8_t> row;
  thread_local std::vector<float> col;
  row.resize(nsb * G::kBytes);
  col.resize(M);
  for (int r = 0; r < kRows; ++r) {
    for (int64_t s = 0; s < nsb; ++s) unpack_super<G>(grp + s * G::kGroupBytes, r, row.data() + s * G::kBytes);
    row_kernel(row.data(), col.data());
    for (int64_t m = 0; m < M; ++m) out[m * kRows + r] = col[m];
  }
}

#ifdef PD_AVX2
// The group kernels' prefetch: every line of the group super-block one ahead, into L1. The hardware prefetchers
// do little for these kernels: without it q4k16's gate|up read 24 GB/s where a sum over 512 MB read 45. Qwen2.5-
// 1.5B's Q6_K shapes, one activation row, 2 threads, from DRAM: two ahead into L2 read 33-39 GB/s where the rows
// read 36-46, four ahead 31-35, none 26-30; this 37-42. Its Q4_K gate|up (q4k16), 12 alternating rounds: two
// ahead into L2 37 GB/s (median), four ahead 35, this 41, two ahead into L1 41, non-temporal one ahead 43, every
// other line 26, none 24. A whole decode step (alternating builds, within one bandwidth phase) ran 0.99-1.08x as
// fast with this as with two ahead into L2 on that file, 0.99x on a Llama-3.2-3B-shaped Q4_K_M one.
template <class G>
inline void prefetch(const uint8_t* gs) {
  for (int64_t i = 0; i < G::kGroupBytes; i += 64) _mm_prefetch((const char*)(gs + G::kGroupBytes + i), _MM_HINT_T0);
}
#endif

#ifdef PD_AVX512
// out[m * 16 + r] = hsum's order over the eight per-block accumulators acc[8 m + b] of activation row m (isa.h's
// hsum(acc) + hsum(0) for each row's lanes): ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), then + 0
inline void store_hsum8(const __m512* acc, int64_t M, float* out) {
  for (int64_t m = 0; m < M; ++m) {
    const __m512* v = acc + 8 * m;
    const __m512 e = _mm512_add_ps(_mm512_add_ps(v[0], v[4]), _mm512_add_ps(v[2], v[6]));
    const __m512 o = _mm512_add_ps(_mm512_add_ps(v[1], v[5]), _mm512_add_ps(v[3], v[7]));
    _mm512_storeu_ps(out + m * kRows, _mm512_add_ps(_mm512_add_ps(e, o), _mm512_setzero_ps()));
  }
}
#endif

#ifdef PD_AVX512
// The group kernels (q5k16.h, q6k16.h, q3k16.h, iq4xs16.h): out[m * 16 + r] = weight row 16 g + r . activation row m for
// all M rows. Per group super-block s (prefetch: the next one's lines into L1) unpack(bytes, u) once
// into the format's U, then accumulate(std::integral_constant<int, MT>, u, m0, s, acc) over the activation rows 4,
// 2 and 1 at a time (they share the unpacked codes); kAccs fp32 accumulators a row: 8 (one a 32-weight block,
// finished in hsum's order: store_hsum8) or 1 (the row's result).
template <class G, class U, int kAccs, class Unpack, class Accumulate>
inline void group_kernel(const uint8_t* qs, int64_t nsb, int64_t M, int64_t g, float* out, Unpack&& unpack,
                         Accumulate&& accumulate) {
  const uint8_t* grp = qs + g * nsb * G::kGroupBytes;
  thread_local std::vector<__m512> acc;
  thread_local U u;
  acc.assign(kAccs * M, _mm512_setzero_ps());
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* gs = grp + s * G::kGroupBytes;
    prefetch<G>(gs);
    unpack(gs, u);
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) accumulate(std::integral_constant<int, 4>{}, u, m, s, acc.data());
    for (; m + 2 <= M; m += 2) accumulate(std::integral_constant<int, 2>{}, u, m, s, acc.data());
    if (m < M) accumulate(std::integral_constant<int, 1>{}, u, m, s, acc.data());
  }
  if constexpr (kAccs == 8) {
    store_hsum8(acc.data(), M, out);
  } else {
    for (int64_t m = 0; m < M; ++m) _mm512_storeu_ps(out + m * kRows, acc[m]);
  }
}
#endif

// A GEMM panel of group g through the rows' own unpacker: unpack_rows(the group's 16 rows, row-ordered)
template <class G, class UnpackRows>
inline void panel_via_rows(const uint8_t* qs, int64_t nb, int64_t g, UnpackRows&& unpack_rows) {
  const int64_t nsb = nb / 8;
  thread_local std::vector<uint8_t> rows;
  group_to_rows<G>(qs + g * nsb * G::kGroupBytes, nsb, rows);
  unpack_rows(rows.data());
}

}  // namespace row_groups
}  // namespace pagedeck
