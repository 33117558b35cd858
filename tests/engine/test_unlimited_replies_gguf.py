"""Replies without a limit on a GGUF: 16 jobs with max_new_tokens=None (each runs until its context is full) on a
cache that holds four whole contexts, the old rule's four reservations. Pages on demand runs more than four
at once, preempts when the pool runs dry, and every job still finishes with exactly its solo run's greedy
output, on the GGUF's weights dense and packed (the file's own Q8_0 blocks in the CPU kernels)."""
from __future__ import annotations

import pytest

from engine import DynamicJob, Model, Tokenizer
from tests.engine.pagetable_checks import check_released
from tests.engine.test_generator import GREEDY, prompt_ids
from tests.engine.test_preemption import checked, generator, run
from tests.tiny_models import write_tiny_gguf

CTX = 64  # the context (max_seq_len): 4 pages of 16


@pytest.fixture(scope="module", params=[("F32", "dense"), ("Q8_0", "packed")], ids=["dense", "packed"])
def weights(request, tiny_llama_folder, tmp_path_factory):
    qtype, fmt = request.param
    path = write_tiny_gguf(tiny_llama_folder, tmp_path_factory.mktemp("unlimited") / f"tiny-{qtype}.gguf", qtype)
    model = Model.load(path, weights=fmt)
    assert model.weight_format == fmt
    return model, Tokenizer.load(path)


def test_sixteen_unlimited_replies_on_four_reservations_equal_their_solo_runs(weights):
    prompts = [prompt_ids(5 + 3 * i, 200 + i) for i in range(16)]
    solo = [run(generator(weights, CTX, max_seq_len=CTX), [DynamicJob(p, gen_settings=GREEDY)])[0][0] for p in prompts]
    for (tokens, _, _, reason), p in zip(solo, prompts):
        assert len(tokens) == CTX - p.shape[1] and reason == "max_new_tokens"

    gen = generator(weights, 4 * CTX, max_seq_len=CTX)  # four whole contexts: the old rule ran four at a time
    jobs = [DynamicJob(p, gen_settings=GREEDY) for p in prompts]
    assert all(job.max_new_tokens is None for job in jobs)
    squeezed, peak = run(gen, jobs, checked)
    for i, (got, want) in enumerate(zip(squeezed, solo)):
        assert got == want, f"job {i} (prompt of {prompts[i].shape[1]} tokens) differs from its solo run"
    m = gen.metrics()
    assert peak > 4 and m["preemptions_total"] > 0 and m["resumes_total"] == m["preemptions_total"], (peak, m)
    check_released(gen.pagetable)
