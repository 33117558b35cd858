"""Pagedeck's logits beside llama.cpp's on the same tiny GGUFs, one per architecture and one per ggml type:
the files, the llama.cpp side (tests.oracles.llamacpp_peer, one subprocess for all of them) and the measures.
`python -m tests.llamacpp_fidelity` prints the table docs/models/fidelity.md quotes.

Every file is a tiny random model of tests.tiny_models.write_wide_gguf (rows of 256, so every type fits),
written F32 and quantized by llama.cpp's own quantizer, one type for every matrix. The sequence is
teacher-forced: pagedeck's weights="dense" reads it in one forward (fp32 activations over the file's
exact weights), weights="packed" too but with no dense copy kept, so every row goes through its int8
kernels (what decoding, and a big model's prompts, run).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# every ggml type pagedeck reads that llama.cpp quantizes and runs on a CPU (imatrix-only types with a
# uniform importance matrix)
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
         "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0",
         "MXFP4", "NVFP4"]
# every architecture pagedeck and llama.cpp both load (Mistral's GGUFs are llama ones: "llama" covers them)
ARCHS = ["llama", "llama3", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "phi3-long"]
ARCH_TYPES = ["F32", "Q8_0", "Q4_K"]  # each architecture in these; llama in every type
FORMATS = ["dense", "packed"]
DENSE_TYPES = ("F32", "F16", "BF16")  # weights="packed" keeps these dense: one format to test
SEQ_LEN = 70  # past the sliding windows (16-24) and LongRoPE's original length (64): llama.cpp's n_ctx > 64 too


def sequence(vocab: int, n: int = SEQ_LEN, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [1] + torch.randint(3, vocab, (n - 1,), generator=g).tolist()  # BOS, then any non-control token


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per position, nats."""
    lp, lq = p_logits.double().log_softmax(-1), q_logits.double().log_softmax(-1)
    return (lp.exp() * (lp - lq)).sum(-1)


@dataclass
class Files:
    """The GGUFs ({(arch, type): path}), the token ids and llama.cpp's logits of each ({key: result})."""
    paths: dict
    ids: list[int]
    peer: dict

    def __post_init__(self):
        self._ours = {}

    def ours(self, key, fmt: str) -> torch.Tensor:
        """pagedeck_logits of a file, computed once."""
        if (key, fmt) not in self._ours:
            self._ours[key, fmt] = pagedeck_logits(self.paths[key], self.ids, fmt)
        return self._ours[key, fmt]

    def llamacpp(self, key) -> torch.Tensor:
        result = self.peer[key]
        if not result["ok"]:
            raise RuntimeError(f"llama.cpp failed on {key}: {result['error']}")
        return torch.from_numpy(np.load(result["out"]))


def build(tmp: str | Path, cases: list[tuple[str, str]] | None = None) -> Files:
    """Write the F32 source of each arch, quantize it with llama.cpp, and get llama.cpp's logits of each
    file, all in one subprocess. cases: (arch, type) pairs, by default llama in TYPES and ARCHS in ARCH_TYPES."""
    from tests.tiny_models import spm_vocabulary, write_wide_gguf
    from tests.oracles.llamacpp_peer import run_jobs

    tmp = Path(tmp)
    cases = cases or default_cases()
    ids = sequence(len(spm_vocabulary("llama")[0]))
    sources = {a: write_wide_gguf(tmp, a, seed=ARCHS.index(a)) for a in dict.fromkeys(a for a, _ in cases)}
    paths, jobs = {}, []
    for arch, qtype in cases:
        path = sources[arch] if qtype == "F32" else tmp / f"{arch}-{qtype}.gguf"
        if qtype != "F32":
            jobs.append({"op": "quantize", "src": str(sources[arch]), "dst": str(path), "type": qtype})
        paths[arch, qtype] = path
    logit_jobs = [{"op": "logits", "model": str(p), "ids": ids, "out": str(p.with_suffix(".npy"))}
                  for p in paths.values()]
    results = run_jobs(jobs + logit_jobs, tmp)
    failed = [(j, r) for j, r in zip(jobs, results) if not r["ok"]]
    peer = dict(zip(paths, results[len(jobs):]))
    for job, r in failed:  # a file llama.cpp could not write: its logits job failed too, say why
        key = next(k for k, p in paths.items() if str(p) == job["dst"])
        peer[key] = {"ok": False, "error": f"quantizing: {r['error']}"}
    for key, r in peer.items():
        if r["ok"]:
            r["out"] = str(paths[key].with_suffix(".npy"))
    return Files(paths, ids, peer)


def default_cases() -> list[tuple[str, str]]:
    return list(dict.fromkeys([("llama", t) for t in TYPES] + [(a, t) for a in ARCHS for t in ARCH_TYPES]))


def pagedeck_logits(path: Path, ids: list[int], fmt: str) -> torch.Tensor:
    """Teacher-forced logits in one forward. Packed: loaded as a big model is (no dense copy for prompt
    rows), so every row goes through the int8 kernels decoding uses."""
    from engine import Model
    from engine.model.packing import repack
    from tools.logits import forward_tokens

    saved = repack.DENSE_COPY_MAX_BYTES
    repack.DENSE_COPY_MAX_BYTES = 0 if fmt == "packed" else saved
    try:
        model = Model.load(path, weights=fmt, device="cpu", dtype=torch.float32, check_memory=False)
    finally:
        repack.DENSE_COPY_MAX_BYTES = saved
    assert model.weight_format == fmt
    return forward_tokens(model, torch.tensor(ids))


def measure(files: Files, key, fmt: str) -> dict:
    """KL(llama.cpp || pagedeck) and top-1 agreement on one file; beside them KL(llama.cpp || fp32), the
    fp32 reference being pagedeck dense on the arch's F32 source (what the type and llama.cpp's
    arithmetic cost together)."""
    theirs = files.llamacpp(key)
    ours = files.ours(key, fmt)
    reference = files.ours((key[0], "F32"), "dense") if (key[0], "F32") in files.paths else None
    picked = ours.argmax(-1)
    return {"kl": kl(theirs, ours).mean().item(), "kl_max": kl(theirs, ours).max().item(),
            "top1": (theirs.argmax(-1) == picked).float().mean().item(),
            # how much worse, by llama.cpp's logits, pagedeck's top token is than llama.cpp's (0: the same one)
            "regret": (theirs.max(-1).values - theirs.gather(-1, picked[:, None])[:, 0]).max().item(),
            "kl_ref": kl(theirs, reference).mean().item() if reference is not None else float("nan")}


def main(argv: list[str] | None = None) -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        files = build(tmp)
        print(f"{len(files.ids)} tokens teacher-forced; KL in nats/token (mean over positions)\n")
        print("| arch | type | weights | top-1 agreement | top-1 regret | KL(llama.cpp ‖ pagedeck) | max KL | "
              "KL(llama.cpp ‖ fp32 source) |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
        for key in files.paths:
            for fmt in FORMATS if key[1] not in DENSE_TYPES else ["dense"]:
                try:
                    r = measure(files, key, fmt)
                except Exception as e:  # report and go on: the table is for reading
                    print(f"| {key[0]} | {key[1]} | {fmt} | error: {e} |")
                    continue
                print(f"| {key[0]} | {key[1]} | {fmt} | {100 * r['top1']:.1f} % | {r['regret']:.2f} | {r['kl']:.2e} "
                      f"| {r['kl_max']:.2e} "
                      f"| {r['kl_ref']:.2e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
