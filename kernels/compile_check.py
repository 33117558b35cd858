"""Ahead-of-time compile of every Triton kernel variant for real GPU targets, on a machine without a GPU.

The CPU interpreter (used by the tests) checks numerics but not what only the compiler enforces (tl.dot
shapes, type rules, register and shared-memory budgets). This compiles each variant to a cubin with
Triton's bundled ptxas and reports its resources: `python -m kernels.compile_check [--arch 80 90]`."""

from __future__ import annotations

import argparse

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import triton_decode, triton_kv, triton_pointwise, triton_prefill

DT = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}
POOL = {0: None, 8: ("*u8", "*u8", "*fp16"), 6: ("*u8", "*u8", "*fp16"), 4: ("*u8", "*u8", "*fp16")}


def _compile(fn, types: dict, constexprs: dict, arch: int):
    sig = {}
    for name in fn.arg_names:
        sig[name] = "constexpr" if name in constexprs else types.get(name, "i32")
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32))


def _attn_types(dtype: str, fmt: int) -> dict:
    t = {"q": DT[dtype], "out": DT[dtype], "bt": "*i32", "kv_lens": "*i32", "cu_q": "*i32",
         "mid_o": "*fp32", "mid_lse": "*fp32", "qk_scale": "fp32"}
    pool = POOL[fmt] or (DT[dtype],) * 3
    for prefix in ("k", "v"):
        t[prefix + "d"], t[prefix + "h"], t[prefix + "s"] = pool
    return t


def variants(dtype: str = "fp16", fmt: int = 0, D: int = 128, G: int = 4, PS: int = 16):
    """(name, kernel, types, constexprs) for one model shape; the launchers' own tile choices."""
    BD = triton.next_power_of_2(D)
    BG = triton.next_power_of_2(G)
    gs = 32 if fmt else D
    t = _attn_types(dtype, fmt)
    rows = 64 if BD > 128 or dtype == "fp32" else 128
    common = dict(G=G, D=D, PS=PS, FMT=fmt, GS=gs, BLOCK_D=BD, IEEE=dtype == "fp32")
    out = []
    for direct in (True, False):
        out.append((f"decode_stage1[{dtype},fmt{fmt},direct={direct}]", triton_decode._decode_stage1, t,
                    dict(common, BLOCK_G=max(16, BG), BLOCK_N=64 if BD <= 128 else 32, DIRECT=direct)))
    out.append((f"decode_stage2[{dtype}]", triton_decode._decode_stage2, t, dict(D=D, BLOCK_D=BD)))
    out.append((f"prefill[{dtype},fmt{fmt}]", triton_prefill._prefill_kernel, t,
                dict(common, BLOCK_M=max(1, rows // BG), BLOCK_G=BG, BLOCK_N=32 if BD > 128 else 64)))
    kvt = {"src": DT[dtype], "slots": "*i64"}
    pool = POOL[fmt] or (DT[dtype],) * 3
    kvt["data"], kvt["high"], kvt["scales"] = pool
    out.append((f"write_kv[{dtype},fmt{fmt}]", triton_kv._write_kv_kernel, kvt,
                dict(FMT=fmt, D=D, GS=gs, BLOCK_D=BD, BLOCK_G=triton.next_power_of_2(max(D // gs, 1)))))
    return out


def pointwise_variants(dtype: str = "fp16", hidden: int = 4096):
    p = DT[dtype]
    return [
        (f"rms_norm[{dtype},res]", triton_pointwise._rms_norm_kernel,
         {"x": p, "res": p, "w": p, "out": p, "res_out": p, "eps": "fp32"},
         dict(HAS_RES=True, BLOCK=triton.next_power_of_2(hidden))),
        (f"rotary[{dtype}]", triton_pointwise._rotary_kernel,
         {"q": p, "k": p, "pos": "*i64", "inv_freq": "*fp32"}, dict(HALF=64, BLOCK=64)),
        (f"silu_mul[{dtype}]", triton_pointwise._silu_mul_kernel, {"gu": p, "out": p}, dict(BLOCK=1024)),
    ]


def report(name: str, k) -> str:
    md = k.metadata
    return f"{name:44s} warps={md.num_warps} shared={md.shared:6d}B regs={getattr(k, 'n_regs', '?')}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--arch", type=int, nargs="+", default=[90])
    args = ap.parse_args()
    for arch in args.arch:
        print(f"== sm_{arch}")
        todo = []
        for dtype in ("fp16", "bf16"):
            for fmt in (0, 8, 6, 4):
                todo += variants(dtype, fmt)
            todo += pointwise_variants(dtype)
        todo += variants("fp32", 0, D=64, G=3)
        for name, fn, types, consts in todo:
            print(report(name, _compile(fn, types, consts, arch)), flush=True)


if __name__ == "__main__":
    main()
