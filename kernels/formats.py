"""The packed weight formats, one entry each: the single table every other part reads.

A packed (N, K) matrix is `blocks` = (qs, d, m) (kernels.packed) in one of the formats below. Each entry says:
- `name`: what the loader, qlinear's classes and the memory estimate call it;
- `exact`: the GGUF types it holds exactly, {type name: bytes a block adds to the file's own} (Q4_0's and
  Q5_0's minimum -8d / -16d is stored beside the scale, 2 bytes a block the file derives);
- `values`, `code_bytes`: weights a block and bytes of qs a block (a K-quant's super-block holds its scales);
- `scales`: fp16 tensors of one value a block beside qs: 2 (d and m), 1 (d), 0 (the scales live inside the
  blocks; d is then the empty NO_SCALES);
- `kernel_id`: the C++ kernels' id of the format in rows (qmatmul.cpp dispatches on it; kernels/cpu/formats.h
  is generated from this table), `grouped_id`: its id with rows regrouped GROUP_ROWS at a time (the same bits,
  a layout the decode or GEMM tiles read without horizontal reductions or panel unpacking), None where the
  format has no grouped layout;
- `start_only`: a layout a model only starts on (its mapped file's blocks read as stored, engine.model.settle)
  while they move into the layout of the type's holder, with the holder's bits; never what a load keeps.

A matrix's kernel id travels beside its blocks (PackedLinear.kernel_id) into every C++ call, and the C++ checks
the tensors' shapes against the layout that id names: a new layout whose rows have another's byte count is
still refused, never read as the other. Every stored type no format holds exactly is re-quantized to
REQUANTIZED (q8, Q8_0's rule). docs/adding-a-quant-format.md is the step-by-step for a new entry.

`python -m kernels.formats` rewrites kernels/cpu/formats.h from this table (tests/kernels/test_formats.py
checks that the committed header is current).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

GROUP = 32  # weights a block of the per-32 formats (GGUF's QK4_x / QK8_0)
SUPER = 256  # weights a K-quant super-block (GGUF's QK_K)
GROUP_ROWS = 16  # rows a group of the grouped layouts (kernels/cpu/row_groups.h's formats, q8.h's q8g, affine_groups.h)


@dataclass(frozen=True)
class Format:
    name: str
    kernel_id: int
    exact: dict[str, int]
    values: int
    code_bytes: int
    scales: int
    grouped_id: int | None = None
    start_only: bool = False

    @property
    def block_bytes(self) -> int:
        """Bytes a block takes in memory: its codes and its fp16 scale values."""
        return self.code_bytes + 2 * self.scales

    def row_bytes(self, k: int) -> int:
        """Bytes of qs a row of k weights takes (in rows; a group's row of qs is GROUP_ROWS of these)."""
        return k // self.values * self.code_bytes

    def nbytes(self, n: int, k: int) -> int:
        """Bytes of an (n, k) matrix: codes and scale values (the scale buffers' SCALE_PAD padding aside)."""
        return n * (k // self.values) * self.block_bytes

    def qs_shape(self, n: int, k: int, grouped: bool = False) -> tuple[int, int]:
        """qs's shape for an (n, k) matrix, in rows or (grouped) in groups of GROUP_ROWS rows."""
        if grouped:
            return n // GROUP_ROWS, self.row_bytes(k) * GROUP_ROWS
        return n, self.row_bytes(k)

    def id(self, grouped: bool = False) -> int:
        """The C++ kernels' id of this format's layout, in rows or in groups."""
        if grouped and self.grouped_id is None:
            raise ValueError(f"{self.name} has no grouped layout")
        return self.grouped_id if grouped else self.kernel_id


# The kernel ids are the C++ kernels' (kernels/cpu/formats.h); their order is history, never meaning.
Q8 = Format("q8", 0, {"Q8_0": 0}, GROUP, GROUP, 1, grouped_id=6)
Q4 = Format("q4", 1, {"Q4_0": 2, "Q4_1": 0}, GROUP, GROUP // 2, 2, grouped_id=19)
Q6 = Format("q6", 2, {"Q6_K": 0}, SUPER, 210, 0, grouped_id=11)
Q4K = Format("q4k", 3, {"Q4_K": 0}, SUPER, 144, 0, grouped_id=4)
Q5 = Format("q5", 5, {"Q5_0": 2, "Q5_1": 0}, GROUP, 20, 2, grouped_id=20)
# the 4-bit lookup-table family (kernels/cpu/lut4.h): the file's blocks as they are, their scales inside them
MXFP4 = Format("mxfp4", 7, {"MXFP4": 0}, GROUP, 17, 0)  # E8M0 exponent byte + 32 E2M1 codes
IQ4NL = Format("iq4nl", 8, {"IQ4_NL": 0}, GROUP, 18, 0)  # fp16 d + 32 codes into kvalues_iq4nl
IQ4XS = Format("iq4xs", 9, {"IQ4_XS": 0}, SUPER, 136, 0, grouped_id=13)  # fp16 d, eight 6-bit scales, 256 codes (IQ4_NL's table)
# Q4_K with a plane of fifth bits, read by q4k's kernels through its layout (kernels/cpu/kquant.h, q4k.h)
Q5K = Format("q5k", 10, {"Q5_K": 0}, SUPER, 176, 0, grouped_id=12)
# Q8_0's blocks as stored (fp16 d + 32 int8 codes), read by the lookup-table family's kernels with q8's bits
Q8S = Format("q8s", 14, {"Q8_0": 0}, GROUP, 34, 0, start_only=True)
# Q5_0's blocks as stored (fp16 d, 32 fifth bits, 16 nibble bytes), read by q5's kernels with q5's bits
Q5S = Format("q5s", 15, {"Q5_0": 0}, GROUP, 22, 0, start_only=True)
# Q3_K's super-blocks as stored (hmask, 2-bit pairs, sixteen 6-bit scales, fp16 d), read by q6's kernels
Q3K = Format("q3k", 16, {"Q3_K": 0}, SUPER, 110, 0, grouped_id=17)
# Q2_K's super-blocks as stored (4-bit scales and minimums, 2-bit pairs, fp16 d and dmin), read by q6's kernels
Q2K = Format("q2k", 18, {"Q2_K": 0}, SUPER, 84, 0)

FORMATS: dict[str, Format] = {f.name: f for f in (Q8, Q4, Q6, Q4K, Q5, MXFP4, IQ4NL, IQ4XS, Q5K, Q8S, Q5S, Q3K, Q2K)}
REQUANTIZED = Q8  # every stored type no format holds exactly (IQ2_XS, IQ3_S, F16, ...) becomes this one
# GGUF type name -> the format a load keeps it in
HOLDER: dict[str, Format] = {t: f for f in FORMATS.values() if not f.start_only for t in f.exact}
# GGUF type name -> the start-only format reading its blocks as stored, where its holder repacks them
STARTS_ON: dict[str, Format] = {t: f for f in FORMATS.values() if f.start_only for t in f.exact}
_CPP_NAMES = {"q8": "kQ8", "q4": "kQ4", "q6": "kQ6", "q4k": "kQ4K", "q5": "kQ5", "mxfp4": "kMXFP4", "iq4nl": "kIQ4NL",
              "iq4xs": "kIQ4XS", "q5k": "kQ5K", "q8s": "kQ8S", "q5s": "kQ5S", "q3k": "kQ3K", "q2k": "kQ2K"}
_CPP_GROUPED = {"q8": "kQ8G", "q4": "kQ4G", "q5": "kQ5G", "q4k": "kQ4K16", "q6": "kQ6K16", "q5k": "kQ5K16", "iq4xs": "kIQ4XS16", "q3k": "kQ3K16"}


def get(name: str) -> Format:
    """The format called `name`."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown packed format {name!r}; known: {sorted(FORMATS)}") from None


def holding(type_name: str, weights: str = "packed") -> Format:
    """The format a stored GGUF type becomes: under weights="packed" the format holding it exactly, else (and
    under weights="q8") REQUANTIZED."""
    return HOLDER.get(type_name, REQUANTIZED) if weights == "packed" else REQUANTIZED


def holds_exactly(type_name: str, name: str) -> bool:
    """Whether format `name` holds this stored type's weights exactly."""
    return type_name in get(name).exact


def ggml_block(type_name: str) -> tuple[int, int]:
    """(weights, bytes) of one block of a GGUF type as the file stores it (gguf-py's GGML_QUANT_SIZES): the
    raw blocks' sizes, for readers of the file's own bytes (kernels.triton_dequant, the registry's checks)."""
    return GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]


def cpp_header() -> str:
    """kernels/cpu/formats.h's text: the C++ ids and layout sizes of every format, from this table."""
    rows = []
    for f in sorted(FORMATS.values(), key=lambda f: f.kernel_id):
        rows.append((f.kernel_id, _CPP_NAMES[f.name], f.name, f.values, f.code_bytes, f.scales, 1))
        if f.grouped_id is not None:
            rows.append((f.grouped_id, _CPP_GROUPED[f.name], f"{f.name} grouped", f.values, f.code_bytes,
                         f.scales, GROUP_ROWS))
    rows.sort()
    if [r[0] for r in rows] != list(range(len(rows))):
        raise ValueError("kernel ids must be 0..n-1 without gaps")
    enum = ", ".join(f"{r[1]} = {r[0]}" for r in rows)
    table = "\n".join(f"    {{{r[3]}, {r[4]}, {r[5]}, {r[6]}, \"{r[2]}\"}},  // {r[1]}" for r in rows)
    return f"""// Generated by `python -m kernels.formats` from kernels/formats.py (the formats' table): do not edit.
// The packed formats' ids (the `fmt` argument of qmatmul and decode_layers) and their layouts, which qmatmul
// checks a call's tensors against.
#pragma once

#include <cstdint>

namespace pagedeck {{
namespace formats {{

enum Format : int {{ {enum} }};
constexpr int64_t kCount = {len(rows)};

struct Layout {{
  int64_t values;      // weights a block
  int64_t code_bytes;  // bytes of qs a block of one row
  int64_t scales;      // fp16 (N, K / values) tensors beside qs: 2 (d, m), 1 (d), 0 (inside the blocks)
  int64_t rows;        // rows a group of qs (1: rows)
  const char* name;
}};

constexpr Layout kLayouts[kCount] = {{
{table}
}};

}}  // namespace formats
}}  // namespace pagedeck
"""


HEADER = Path(__file__).with_name("cpu") / "formats.h"


def main() -> int:
    """`python -m kernels.formats`: write kernels/cpu/formats.h from the table."""
    HEADER.write_text(cpp_header())
    print(f"wrote {HEADER}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
