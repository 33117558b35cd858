"""Every hot Triton kernel must compile for a real GPU target (sm_90) even on a machine without one: the
CPU interpreter accepts things the compiler rejects (tl.dot shapes, mismatched return types). The launch
configurations of the attention hot paths must also fit in registers without spilling."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from kernels import compile_check as cc  # noqa: E402


def _pick(variants, *names):
    return [v for v in variants if any(v[0].startswith(n) for n in names)]


CASES = (
    _pick(cc.variants("fp16", 0), "decode_stage1", "decode_stage2", "prefill")
    + _pick(cc.variants("bf16", 6), "decode_stage1", "prefill", "write_kv")
    + _pick(cc.variants("fp16", 4, D=64, G=3), "decode_stage1", "write_kv")
    + cc.pointwise_variants("bf16")
)


@pytest.mark.parametrize("name,fn,types,consts,warps", CASES, ids=[c[0] for c in CASES])
def test_compiles_for_sm90(name, fn, types, consts, warps):
    kernel = cc._compile(fn, types, consts, 90, num_warps=warps)
    assert kernel.asm["cubin"]
    if name.startswith(("decode_stage1[fp16,fmt0", "prefill[fp16,fmt0")):
        assert cc.resources(kernel)["stack"] == 0, f"{name} spills registers"
