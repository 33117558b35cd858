"""`python -m engine generate|bench` on tiny random models (and one greedy chat on the default model)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer
from engine.bench.serving import decode_weight_bytes
from engine.bench.synthetic import placeholder_tokenizer, random_model, tensor_shapes
from engine.cli import build_parser, main, sampler_from_args
from engine.model.config import ModelConfig
from tests.tiny_models import write_tiny_model
from tools.logits import forward_tokens

ROOT = Path(__file__).resolve().parents[2]
GEN_KEYS = {"text", "new_tokens", "prompt_tokens", "eos_reason", "tokens_per_s", "ttft_ms"}
SIDE_KEYS = {"batch1_tok_s", "streams_tok_s", "ttft_uncached_ms", "ttft_cached_ms", "load_s"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("cli") / "llama")


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def engine_completion(folder: Path, ids: torch.Tensor, n: int, settings: SamplerSettings, seed=None, stops=()) -> str:
    """The same request through the library, as the oracle for what the CLI prints."""
    model, tok = Model.load(folder), Tokenizer.load(folder)
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=512, page_size=256), tok)
    job = DynamicJob(ids, n, gen_settings=settings, seed=seed, stop_conditions=list(stops))
    gen.enqueue(job)
    text = ""
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming":
                text += r["text"]
    return text


# ---- generate -----------------------------------------------------------------------------------
def test_generate_json_matches_the_library(tiny, capsys):
    rc, out, err = run_main(capsys, "generate", "--model", str(tiny), "--prompt", "The quick brown fox",
                            "--max-new-tokens", "12", "--greedy", "--json")
    assert rc == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert set(report) >= GEN_KEYS
    tok = Tokenizer.load(tiny)
    ids = tok.encode("The quick brown fox", add_bos=tok.add_bos)
    assert report["prompt_tokens"] == ids.shape[1]
    assert report["new_tokens"] == 12 and report["eos_reason"] == "max_new_tokens"
    assert report["tokens_per_s"] > 0 and report["ttft_ms"] > 0
    assert report["text"] == engine_completion(tiny, ids, 12, SamplerSettings.greedy(), stops=[tok.eos_token_id])


def test_generate_streams_text_in_pieces(tiny, capsys, monkeypatch):
    writes: list[str] = []

    class Recorder:
        def write(self, s: str) -> int:
            writes.append(s)
            return len(s)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stdout", Recorder())
    rc = main(["generate", "--model", str(tiny), "--prompt", "Once upon a time", "--max-new-tokens", "10", "--greedy"])
    monkeypatch.undo()
    assert rc == 0
    tok = Tokenizer.load(tiny)
    expected = engine_completion(tiny, tok.encode("Once upon a time", add_bos=tok.add_bos), 10, SamplerSettings.greedy(),
                                 stops=[tok.eos_token_id])
    assert "".join(writes) == expected + "\n"
    assert len([w for w in writes if w and w != "\n"]) >= 3  # streamed as generated, not printed once at the end
    assert "10 tokens" in capsys.readouterr().err  # the summary goes to stderr, not into the text


def test_generate_sampler_flags_reach_the_sampler(tiny, capsys):
    flags = ["--temperature", "1.7", "--top-k", "40", "--top-p", "0.9", "--min-p", "0.02",
             "--repetition-penalty", "1.2", "--seed", "11"]
    args = build_parser().parse_args(["generate", "--prompt", "x", *flags])
    s = sampler_from_args(args)
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.token_repetition_penalty) == (1.7, 40, 0.9, 0.02, 1.2)
    rc, out, err = run_main(capsys, "generate", "--model", str(tiny), "--prompt", "Hello", "--max-new-tokens", "16",
                            "--json", *flags)
    assert rc == 0, err
    text = json.loads(out)["text"]
    tok = Tokenizer.load(tiny)
    settings = SamplerSettings(temperature=1.7, top_k=40, top_p=0.9, min_p=0.02, token_repetition_penalty=1.2)
    assert text == engine_completion(tiny, tok.encode("Hello", add_bos=tok.add_bos), 16, settings, seed=11, stops=[tok.eos_token_id])
    rc, out2, _ = run_main(capsys, "generate", "--model", str(tiny), "--prompt", "Hello", "--max-new-tokens", "16",
                           "--json", *flags[:-1], "12")
    assert json.loads(out2)["text"] != text  # the seed is used


def test_generate_chat_applies_template_and_system_prompt(tiny, capsys):
    tok = Tokenizer.load(tiny)
    for system in (None, "You are terse."):
        argv = ["generate", "--model", str(tiny), "--chat", "Hi there", "--max-new-tokens", "3", "--greedy", "--json"]
        messages = [{"role": "user", "content": "Hi there"}]
        if system:
            argv += ["--system", system]
            messages.insert(0, {"role": "system", "content": system})
        rc, out, err = run_main(capsys, *argv)
        assert rc == 0, err
        ids = tok.encode(tok.apply_chat_template(messages), encode_special_tokens=True)
        assert json.loads(out)["prompt_tokens"] == ids.shape[1]


@pytest.mark.slow
def test_chat_default_model_knows_paris(capsys):
    rc, out, err = run_main(capsys, "generate", "--chat", "What is the capital of France?", "--greedy",
                            "--max-new-tokens", "40", "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert "Paris" in report["text"]
    assert report["eos_reason"] == "stop_token"  # <|im_end|>: the chat stops on the tokenizer's stop tokens


@pytest.mark.parametrize("argv, message", [
    (["--model", "/no/such/model", "--prompt", "hi"], "model path does not exist"),
    (["--prompt", "hi", "--temperature", "-1"], "temperature"),
    (["--prompt", "hi", "--top-p", "1.5"], "top_p"),
    (["--prompt", "hi", "--min-p", "2"], "min_p"),
    (["--prompt", "hi", "--top-k", "-3"], "top_k"),
    (["--prompt", "hi", "--repetition-penalty", "0"], "repetition_penalty"),
    (["--prompt", "hi", "--greedy", "--temperature", "0.5"], "--greedy cannot be combined with --temperature"),
    (["--prompt", "hi", "--system", "be nice"], "--system needs --chat"),
])
def test_generate_user_errors_exit_1_with_a_message(argv, message, capsys):
    rc, out, err = run_main(capsys, "generate", *argv)
    assert rc == 1
    assert err.startswith("error: ") and message in err
    assert "Traceback" not in err and out == ""


def test_generate_model_errors(tiny, tmp_path, capsys):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf at all")
    rc, _, err = run_main(capsys, "generate", "--model", str(bad), "--prompt", "hi")
    assert rc == 1 and "GGUF" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = run_main(capsys, "generate", "--model", str(empty), "--prompt", "hi")
    assert rc == 1 and str(empty) in err
    rc, _, err = run_main(capsys, "generate", "--model", str(tiny), "--prompt", "hi", "--max-new-tokens", "100000")
    assert rc == 1 and "exceeds the model's context" in err


@pytest.mark.parametrize("argv", [["generate", "--prompt", "hi", "--max-new-tokens", "0"],
                                  ["generate"], ["generate", "--prompt", "a", "--chat", "b"], ["bench", "--streams", "0"]])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_bench_spec_is_dispatched_with_its_own_arguments(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench-spec", "--help"])
    assert e.value.code == 0
    assert "--draft-tokens" in capsys.readouterr().out  # engine.bench.speculative's parser answered
    assert "bench-spec" in build_parser().format_help()


def test_module_entry_point_reports_errors_without_traceback():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", "/no/such/model", "--prompt", "hi"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert p.stderr.strip() == "error: model path does not exist: /no/such/model"


# ---- bench --------------------------------------------------------------------------------------
def test_bench_json_with_transformers_peer(tiny, capsys):
    threads_before = torch.get_num_threads()
    rc, out, err = run_main(capsys, "bench", "--model", str(tiny), "--streams", "2", "--prompt-tokens", "16",
                            "--new-tokens", "4", "--shared-prefix", "32", "--tail-tokens", "8",
                            "--threads", "1", "--peer", "transformers", "--json")
    assert rc == 0, err
    lines = out.strip().splitlines()
    result = json.loads(lines[-1])
    assert set(result) >= {"engine", "peer", "ratio"}
    engine, peer, ratio = result["engine"], result["peer"], result["ratio"]
    assert set(engine) >= SIDE_KEYS | {"step_host_overhead_ms", "step_host_overhead_pct", "roofline_pct"}
    assert set(peer) >= SIDE_KEYS
    for side in (engine, peer):
        assert all(side[k] > 0 for k in SIDE_KEYS)
    assert engine["ttft_cached_tokens"] == 32  # the second request really reused the shared prefix
    assert 0 < engine["step_host_overhead_ms"] < engine["step_ms"]
    assert ratio["batch1"] == pytest.approx(engine["batch1_tok_s"] / peer["batch1_tok_s"])
    assert ratio["streams"] == pytest.approx(engine["streams_tok_s"] / peer["streams_tok_s"])
    setup = result["setup"]
    assert setup["torch_threads"] == 1 and torch.get_num_threads() == threads_before  # set for the run only
    assert setup["roofline_tok_s"] == pytest.approx(setup["read_bandwidth_gb_s"] * 1e9 / setup["decode_weight_bytes"])
    table = "\n".join(lines[:-1])
    assert "batch-1 decode" in table and "transformers" in table and "pagedeck / transformers" in table


def test_bench_without_peer_has_empty_peer_and_ratio(tiny, capsys):
    rc, out, err = run_main(capsys, "bench", "--model", str(tiny), "--streams", "3", "--prompt-tokens", "8",
                            "--new-tokens", "3", "--shared-prefix", "16", "--tail-tokens", "4", "--json")
    assert rc == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["peer"] == {} and result["ratio"] == {}
    assert set(result["engine"]) >= SIDE_KEYS and result["setup"]["streams"] == 3
    assert "transformers" not in out


def test_bench_rejects_a_context_too_long(tiny, capsys):
    rc, _, err = run_main(capsys, "bench", "--model", str(tiny), "--shared-prefix", "1000")
    assert rc == 1 and "context" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA the synthetic model is built for real")
def test_synthetic_8b_refuses_without_cuda(capsys):
    rc, _, err = run_main(capsys, "bench", "--model", "llama3-8b-random")
    assert rc == 1 and "CUDA" in err and "Traceback" not in err


def test_random_model_runs_through_the_generator():
    config = ModelConfig(arch="llama", vocab_size=49216, hidden_size=32, intermediate_size=64, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)
    model = random_model(config, device="cpu", dtype=torch.float32)
    assert model.num_parameters() == sum(torch.Size(s).numel() for s in tensor_shapes(config).values())
    assert decode_weight_bytes(model) == model.memory_bytes() - 49216 * 32 * 4  # untied: embedding not read
    tok = placeholder_tokenizer(model.vocab_size)  # what the bench gives a synthetic model: no file needed
    assert tok.vocab_size == 49216 and tok.stop_token_ids == {2} and tok.decode([5, 7]) == "t5 t7"
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=256, page_size=16), tok)
    job = DynamicJob(torch.tensor([[5, 6, 7, 8]]), 6, gen_settings=SamplerSettings.greedy())
    gen.enqueue(job)
    tokens = []
    while gen.num_remaining_jobs():
        tokens += [t for r in gen.iterate() if r["stage"] == "streaming" for t in r["token_ids"]]
    assert len(tokens) == 6 and all(0 <= t < tok.vocab_size for t in tokens)
    logits = forward_tokens(model, torch.tensor([[5, 6, 7, 8]]))
    assert torch.isfinite(logits).all() and logits.std() > 0
