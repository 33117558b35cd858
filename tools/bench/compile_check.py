"""Ahead-of-time compile of every Triton kernel variant for real GPU targets, on a machine without a GPU.

The CPU interpreter (used by the tests) checks numerics but not what only the compiler enforces (tl.dot
shapes, type rules, register and shared-memory budgets). This compiles each variant to a cubin with
Triton's bundled ptxas and reports its resources: `python -m tools.bench.compile_check [--arch 80 90]`."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels import triton_decode, triton_dequant, triton_kv, triton_lora, triton_pointwise, triton_prefill

DT = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}
POOL = {0: None, 8: ("*u8", "*u8", "*fp16"), 6: ("*u8", "*u8", "*fp16"), 4: ("*u8", "*u8", "*fp16")}


def _compile(fn, types: dict, constexprs: dict, arch: int, num_warps: int = 4, num_stages: int = 3):
    sig = {}
    for name in fn.arg_names:
        sig[name] = "constexpr" if name in constexprs else types.get(name, "i32")
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def _attn_types(dtype: str, fmt: int) -> dict:
    t = {"q": DT[dtype], "out": DT[dtype], "bt": "*i32", "kv_lens": "*i32", "cu_q": "*i32",
         "mid_o": "*fp32", "mid_lse": "*fp32", "sinks": DT[dtype], "qk_scale": "fp32", "sm_scale": "fp32",
         "softcap": "fp32"}  # sinks: the model's own dtype, as the launchers pass them
    pool = POOL[fmt] or (DT[dtype],) * 3
    for prefix in ("k", "v"):
        t[prefix + "d"], t[prefix + "h"], t[prefix + "s"] = pool
    return t


def variants(dtype: str = "fp16", fmt: int = 0, D: int = 128, G: int = 4, PS: int = 16, softcap: bool = False,
             sinks: bool = False):
    """(name, kernel, types, constexprs, num_warps) for one model shape, with the launchers' own tile
    choices (decode_config / prefill_config); softcap=True: the soft-capped variants (Gemma 2); sinks=True:
    attention sinks (gpt-oss)."""
    BD = triton.next_power_of_2(D)
    BG = triton.next_power_of_2(G)
    gs = 32 if fmt else D
    t = _attn_types(dtype, fmt)
    fp32 = dtype == "fp32"
    common = dict(G=G, D=D, PS=PS, FMT=fmt, GS=gs, BLOCK_D=BD, IEEE=fp32, SOFTCAP=softcap, SINKS=sinks)
    dc = triton_decode.decode_config(D, fmt != 0, fp32)
    pc = triton_prefill.prefill_config(D, fmt != 0, fp32)
    tag = f"{dtype},fmt{fmt},D{D}" + (",softcap" if softcap else "") + (",sinks" if sinks else "")
    out = []
    for direct in (True, False):
        out.append((f"decode_stage1[{tag},direct={direct}]", triton_decode._decode_stage1, t,
                    dict(common, BLOCK_G=max(16, BG), BLOCK_N=dc["BLOCK_N"], DIRECT=direct), dc["num_warps"]))
    out.append((f"decode_stage2[{tag}]", triton_decode._decode_stage2, t, dict(D=D, BLOCK_D=BD, SINKS=sinks), 4))
    out.append((f"prefill[{tag}]", triton_prefill._prefill_kernel, t,
                dict(common, BLOCK_M=max(1, pc["ROWS"] // BG), BLOCK_G=BG, BLOCK_N=pc["BLOCK_N"]), pc["num_warps"]))
    kvt = {"src": DT[dtype], "slots": "*i64"}
    kvt["data"], kvt["high"], kvt["scales"] = POOL[fmt] or (DT[dtype],) * 3
    out.append((f"write_kv[{tag}]", triton_kv._write_kv_kernel, kvt,
                dict(FMT=fmt, D=D, GS=gs, BLOCK_D=BD, BLOCK_G=triton.next_power_of_2(max(D // gs, 1))), 4))
    return out


def pointwise_variants(dtype: str = "fp16", hidden: int = 4096):
    p = DT[dtype]
    return [
        (f"rms_norm[{dtype},res]", triton_pointwise._rms_norm_kernel,
         {"x": p, "res": p, "w": p, "out": p, "res_out": p, "eps": "fp32"},
         dict(HAS_RES=True, BLOCK=triton.next_power_of_2(hidden)), 4),
        (f"rotary[{dtype}]", triton_pointwise._rotary_kernel,
         {"q": p, "k": p, "pos": "*i64", "inv_freq": "*fp32", "factor": "fp32"}, dict(HALF=64, BLOCK=64), 4),
        (f"silu_mul[{dtype}]", triton_pointwise._act_mul_kernel, {"gu": p, "out": p}, dict(GELU=False, BLOCK=1024), 4),
        (f"gelu_mul[{dtype}]", triton_pointwise._act_mul_kernel, {"gu": p, "out": p}, dict(GELU=True, BLOCK=1024), 4),
    ]


def lora_variants(dtype: str = "fp16"):
    """Per-row LoRA shrink/expand with the launcher's tiles for a rank-16..64 stack (segments on)."""
    p = DT[dtype]
    t = {"x": p, "a": p, "out": p, "s": p, "b": p, "y": p, "seg_start": "*i32", "col_scale": "*fp32"}
    common = dict(HAS_SEGS=True, BLOCK_M=triton_lora.BLOCK_M, BLOCK_N=64, IEEE=dtype == "fp32")
    return [(f"lora_shrink[{dtype}]", triton_lora._shrink_kernel, t, dict(common, BLOCK_K=64), 4),
            (f"lora_expand[{dtype}]", triton_lora._expand_kernel, t, dict(common, BLOCK_K=32), 4)]


def dequant_variants(dtype: str = "fp16", qtypes=(12, 14)):
    """The dequant-matmul GEMV and GEMM for ggml types (12 = Q4_K, 14 = Q6_K, 8 = Q8_0, ...)."""
    t = {"x": DT[dtype], "raw": "*u8", "out": DT[dtype]}
    out = []
    for q in qtypes:
        out.append((f"dequant_gemv[{dtype},type{q}]", triton_dequant._gemv_kernel, t,
                    dict(QTYPE=q, BLOCK_N=32, BLOCK_K=64), 8))
        out.append((f"dequant_gemm[{dtype},type{q}]", triton_dequant._gemm_kernel, t,
                    dict(QTYPE=q, BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, IEEE=dtype == "fp32"), 4))
    return out


def resources(k) -> dict:
    """Registers / spill stack of a compiled kernel, read from its cubin with the bundled cuobjdump."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    return {"regs": int(found.group(1)), "stack": int(found.group(2))} if found else {}


def report(name: str, k) -> str:
    md, res = k.metadata, resources(k)
    return (f"{name:44s} warps={md.num_warps} shared={md.shared:6d}B regs={res.get('regs', '?')} "
            f"spill_stack={res.get('stack', '?')}B")


def _pick(todo, *names):
    return [v for v in todo if any(v[0].startswith(n) for n in names) and "direct=True" not in v[0]]


def quick_set():
    """A few variants covering every kernel and format (what the test suite compiles)."""
    return (
        _pick(variants("fp16", 0), "decode_stage1", "decode_stage2", "prefill")
        + _pick(variants("bf16", 6), "decode_stage1", "prefill", "write_kv")
        + _pick(variants("fp16", 4, D=64, G=3), "decode_stage1")
        + _pick(variants("bf16", 0, D=256, G=2, softcap=True), "decode_stage1", "prefill")
        + _pick(variants("bf16", 0, D=64, G=8, sinks=True), "decode_stage1", "decode_stage2", "prefill")
        + pointwise_variants("bf16")
        + lora_variants("bf16")
        + dequant_variants("bf16", (12,))
    )


def full_set():
    todo = []
    for dtype in ("fp16", "bf16"):
        for fmt in (0, 8, 6, 4):
            todo += variants(dtype, fmt)
        todo += pointwise_variants(dtype) + lora_variants(dtype)
    todo += variants("fp32", 0, D=64, G=3)
    todo += variants("fp16", 0, D=256, G=2) + variants("fp16", 4, D=256, G=2) + variants("fp16", 6, D=64, G=3)
    todo += variants("bf16", 0, D=256, G=2, softcap=True)
    todo += variants("bf16", 0, D=64, G=8, sinks=True) + variants("fp16", 8, D=64, G=8, sinks=True)
    todo += dequant_variants("fp16", tuple(triton_dequant.FORMATS))
    return todo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--arch", type=int, nargs="+", default=[90])
    ap.add_argument("--quick", action="store_true", help="only the test suite's subset")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the interpreter cannot compile kernels")
    for arch in args.arch:
        print(f"== sm_{arch}")
        for name, fn, types, consts, warps in quick_set() if args.quick else full_set():
            print(report(name, _compile(fn, types, consts, arch, num_warps=warps)), flush=True)


if __name__ == "__main__":
    main()
