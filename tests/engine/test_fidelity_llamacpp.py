"""Pagedeck against llama.cpp on the same GGUF files: every architecture both load and every ggml type
pagedeck reads give the teacher-forced logits llama.cpp gives (tests.llamacpp_fidelity builds the files,
llama.cpp quantizes them and runs them), in both weight formats; and every type pagedeck cannot read is
refused at load, in one line naming the tensor and its type.

Thresholds. llama.cpp is not an exact oracle. For a quantized matrix it rounds the activations too (to
Q8_0/Q8_1 blocks of 32, to Q8_K blocks of 256 for the K-, I- and T-quants), for BF16 weights it rounds
them to BF16, and it keeps its K/V cache in F16; random layers amplify that rounding. So the KL from
llama.cpp's distribution to pagedeck's has a floor per kind of arithmetic, measured on these files
(`python -m tests.llamacpp_fidelity`, the table in docs/models/fidelity.md):

  kind                      | KL mean, measured max | KL at one position | top-1 regret | bound (mean, position, regret)
  F32, F16 (no rounding)    | 7.6e-6                | 4.0e-5             | 0.00         | 1e-4, 1e-3, 0.02
  BF16 (activations BF16)   | 2.7e-4                | 1.3e-3             | 0.11         | 2e-3, 1e-2, 0.3
  quantized (int8 activ.)   | 2.3e-2 (IQ1_M packed) | 0.22 (IQ3_XXS)     | 0.74         | 5e-2, 0.3, 1.5

and the bounds sit 1.4-25x above (measured: all 9 architectures in F32, Q8_0, Q4_K and Llama in every type). Quantized files must also be nearer llama.cpp than the F32 model they were
quantized from is (KL(llama.cpp || pagedeck) < KL(llama.cpp || fp32 source), measured ratio <= 0.48, for
Q8_0 on Gemma 3): pagedeck reads the file's weights, not something merely near them. That second bound is
what the type's own error allows: 1e-2 nats for Q8_0, 0.06 for Q6_K, 0.2-5 for the rest. A real decoding
bug costs far more (test_a_wrong_decode_is_caught: a swapped nibble order or misplaced sub-block scales,
KL 4.1 and 4.5 measured).
Top-1: random tiny models have near-ties among their ~450 logits, which llama.cpp's rounding flips, so
top-1 agreement is bounded loosely (measured >= 80.0 % quantized, 97 % BF16, 98.6 % F32: one exact tie)
and the regret (how many logits, by llama.cpp's logits, pagedeck's top token is below llama.cpp's) tightly.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.llamacpp_fidelity import ARCH_TYPES, ARCHS, DENSE_TYPES, FORMATS, TYPES, build, kl, measure, pagedeck_logits

BOUNDS = {  # kind: (KL mean, KL at any position, top-1 regret in logits, top-1 agreement)
    "exact": (1e-4, 1e-3, 0.02, 0.95),
    "bf16": (2e-3, 1e-2, 0.3, 0.9),
    "quantized": (5e-2, 0.3, 1.5, 0.75),
}


def kind(qtype: str) -> str:
    return "exact" if qtype in ("F32", "F16") else "bf16" if qtype == "BF16" else "quantized"


def check(files, key, fmt):
    r = measure(files, key, fmt)
    kl_mean, kl_pos, regret, top1 = BOUNDS[kind(key[1])]
    assert r["kl"] < kl_mean and r["kl_max"] < kl_pos and r["regret"] < regret and r["top1"] >= top1, r
    if kind(key[1]) == "quantized":
        assert r["kl"] < r["kl_ref"], r  # nearer llama.cpp than the unquantized model is


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    pytest.importorskip("llama_cpp")
    return build(tmp_path_factory.mktemp("fidelity"))


# weights="packed" keeps F32/F16/BF16 matrices dense: one format to test for those
@pytest.mark.parametrize("qtype,fmt", [(t, f) for t in TYPES for f in FORMATS if f == "dense" or t not in DENSE_TYPES])
def test_every_type_gives_llama_cpps_logits(files, qtype, fmt):
    check(files, ("llama", qtype), fmt)


@pytest.mark.parametrize("qtype", ARCH_TYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_gives_llama_cpps_logits(files, arch, qtype):
    for fmt in FORMATS if qtype not in DENSE_TYPES else ["dense"]:
        check(files, (arch, qtype), fmt)


def test_a_wrong_decode_is_caught(files, monkeypatch):
    """The bounds have teeth: plausible decoding bugs (Q4_0's two nibble halves swapped; Q6_K's sixteen
    sub-block scales in reverse order) move KL far past the quantized bound (4.1 and 4.5 nats measured)."""
    from gguf import GGMLQuantizationType as Q

    from engine.model import ggml_blocks

    def swapped_nibbles(b, out):
        ggml_blocks._dq_q4_0(b, out)
        out.copy_(out.view(-1, 2, 16).flip(1).reshape(out.shape))

    def reversed_scales(b, out):
        q, s = ggml_blocks.q6_k_affine(b)
        torch.mul(s.flip(1), q.float(), out=out.view(-1, 16, 16))

    for qtype, bug in ((Q.Q4_0, swapped_nibbles), (Q.Q6_K, reversed_scales)):
        with monkeypatch.context() as m:
            m.setitem(ggml_blocks._FAST, qtype, bug)
            wrong = pagedeck_logits(files.paths["llama", qtype.name], files.ids, "dense")
        assert kl(files.llamacpp(("llama", qtype.name)), wrong).mean() > 20 * BOUNDS["quantized"][0], qtype


# ---------------------------------------------------------------- types pagedeck cannot read

def with_tensor(src, dst, name: str, data: np.ndarray, raw_dtype):
    """A copy of the GGUF `src` with tensor `name` replaced by `data` stored as ggml type `raw_dtype`."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), str(reader.fields["general.architecture"].contents()))
    for f in reader.fields.values():
        if f.name != "general.architecture" and not f.name.startswith("GGUF."):
            vtype = f.types[0]
            sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(f.name, f.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        if t.name == name:
            w.add_tensor(t.name, data, raw_dtype=raw_dtype)
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    from tests.tiny_models import write_wide_gguf

    return write_wide_gguf(tmp_path_factory.mktemp("refused"), "llama")


def unreadable_types():
    from gguf import GGMLQuantizationType

    from engine.model.ggml_blocks import dequantizable

    return [q.name for q in GGMLQuantizationType if not dequantizable(q)]


@pytest.mark.parametrize("qtype", unreadable_types())
@pytest.mark.parametrize("fmt", FORMATS)
def test_an_unreadable_type_is_refused_at_load_in_one_line(source, tmp_path, qtype, fmt):
    """Q8_K, Q8_1, the integer types...: refused before any tensor is decoded, naming the tensor and the
    type (before, gguf's decoder failed halfway through loading with neither)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from engine import Model
    from engine.model.catalog.info import read_model_info

    q = GGMLQuantizationType[qtype]
    block, block_bytes = GGML_QUANT_SIZES[q]
    raw = np.zeros((256, 512 // block * block_bytes), dtype=np.uint8)  # ffn_down: 256 rows of 512
    path = with_tensor(source, tmp_path / f"{qtype}.gguf", "blk.1.ffn_down.weight", raw, q)
    with pytest.raises(ValueError) as err:
        Model.load(path, weights=fmt, check_memory=False)
    message = str(err.value)
    assert "\n" not in message and f"tensor blk.1.ffn_down.weight is stored as ggml type {qtype}" in message, message
    assert qtype in read_model_info(path).problem


def test_f64_tensors_are_read_exactly(source, tmp_path):
    """F64, the one plain float type llama.cpp writes that pagedeck used to refuse."""
    import gguf

    from engine import Model
    from tools.logits import forward_tokens

    reader = gguf.GGUFReader(str(source))
    down = np.asarray(next(t for t in reader.tensors if t.name == "blk.1.ffn_down.weight").data)
    path = with_tensor(source, tmp_path / "f64.gguf", "blk.1.ffn_down.weight", down.astype(np.float64),
                       gguf.GGMLQuantizationType.F64)
    ids = torch.arange(3, 40)
    a, b = (forward_tokens(Model.load(p, weights="dense", check_memory=False), ids) for p in (source, path))
    assert torch.equal(a, b)
