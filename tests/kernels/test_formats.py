"""kernels.formats, the packed formats' one table: its sizes agree with gguf's for the types each format holds
and with the tensors the loader builds, the C++ header is generated from it, and the C++ kernels take a format
id and refuse blocks whose shapes are not that format's layout."""

from __future__ import annotations

import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from engine.model.packing import repack
from kernels import cpu_ext, formats
from kernels.packed import NO_SCALES
from tools.ggml_writers import quantize as quantize_ggml


@pytest.mark.parametrize("fmt", formats.FORMATS.values(), ids=list(formats.FORMATS))
def test_sizes_agree_with_gguf_for_the_types_held(fmt):
    assert fmt.exact, f"{fmt.name} holds no GGUF type exactly"
    for name, extra in fmt.exact.items():
        values, nbytes = GGML_QUANT_SIZES[Q[name]]
        assert fmt.values == values, (fmt.name, name)
        assert fmt.block_bytes == nbytes + extra, (fmt.name, name)
        assert formats.holding(name, "q8") is formats.REQUANTIZED
        if fmt.start_only:  # read as stored while the blocks move into their holder's layout, never kept
            assert formats.STARTS_ON[name] is fmt and formats.holding(name) is not fmt
            assert not formats.holding(name).start_only
        else:
            assert formats.holding(name) is fmt


def test_every_stored_type_has_one_holder_and_ids_are_distinct():
    held = [t for f in formats.FORMATS.values() if not f.start_only for t in f.exact]
    assert len(held) == len(set(held))
    ids = [f.kernel_id for f in formats.FORMATS.values()] + [f.grouped_id for f in formats.FORMATS.values()
                                                             if f.grouped_id is not None]
    assert sorted(ids) == list(range(len(ids)))
    assert formats.holding("IQ2_XS") is formats.REQUANTIZED and formats.holding("F16") is formats.REQUANTIZED
    assert formats.holding("Q5_K") is formats.Q5K and formats.holding("Q5_K", "q8") is formats.REQUANTIZED


def test_the_cpp_header_is_generated_from_the_table():
    assert formats.HEADER.read_text() == formats.cpp_header(), "run `python -m kernels.formats`"


def _packed(qtype: Q, n: int = 64, k: int = 512):
    raw = torch.from_numpy(quantize_ggml(torch.randn(n, k, generator=torch.Generator().manual_seed(3)), qtype))
    return repack.from_blocks(raw, qtype, (n, k), keep_dense=False)


HELD = [Q[t] for f in formats.FORMATS.values() if not f.start_only for t in f.exact]


@pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")
@pytest.mark.parametrize("qtype", HELD, ids=[t.name for t in HELD])
def test_the_loaders_tensors_are_the_tables_layout(qtype):
    w = _packed(qtype)
    spec = formats.holding(qtype.name)
    grouped = getattr(w, "grouped", False)
    assert w.spec is spec and w.format == spec.name and w.kernel_id == spec.id(grouped)
    assert w.nbytes() == spec.nbytes(*w.shape) == repack.packed_nbytes(spec.name, w.shape)
    assert tuple(w.blocks[0].shape) == spec.qs_shape(*w.shape, grouped)
    assert sum(t is not None and t.numel() > 0 for t in w.blocks[1:]) == spec.scales


@pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")
def test_the_kernel_refuses_blocks_of_another_format():
    ops, x = cpu_ext.ops(), torch.randn(2, 512)
    q6, q4k, q4, q8 = _packed(Q.Q6_K), _packed(Q.Q4_K), _packed(Q.Q4_0), _packed(Q.Q8_0)
    assert torch.equal(ops.qmatmul(x, *q6.blocks, q6.kernel_id, 0), q6(x))
    with pytest.raises(RuntimeError, match="do not match their declared format q4k"):
        ops.qmatmul(x, *q6.blocks, formats.Q4K.kernel_id, 0)
    with pytest.raises(RuntimeError, match="do not match their declared format q6"):
        ops.qmatmul(x, q4k.row_blocks(), NO_SCALES, None, formats.Q6.kernel_id, 0)
    with pytest.raises(RuntimeError, match="do not match their declared format q5"):
        ops.qmatmul(x, *q4.blocks, formats.Q5.kernel_id, 0)
    with pytest.raises(RuntimeError, match="do not match their declared format q8 grouped"):
        ops.qmatmul(x, *q8.blocks, formats.Q8.id(grouped=True), 0)
    with pytest.raises(RuntimeError, match="q4 weights need minimums"):
        ops.qmatmul(x, q4.qs, q4.scale, None, formats.Q4.kernel_id, 0)
    with pytest.raises(RuntimeError, match="unknown packed format id 99"):
        ops.qmatmul(x, *q8.blocks, 99, 0)
