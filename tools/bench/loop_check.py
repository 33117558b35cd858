"""How many replies loop with the app's chat settings: 20 everyday prompts, answered at once.

    python -m tools.bench.loop_check [--preset NAME] [--n 20] [--no-guard] [--json PATH]

The prompts (explanations, lists, poems, advice, code, stories) run together on one DynamicGenerator
with the default model, each as the app sends a new chat's message: its default system prompt and chat
template, `ChatSettings.sampler_settings()` of the app's default settings with the preset's values
(`--preset`, default the app's default preset), max_new_tokens 1024, the model's stop tokens, and the
app's loop guard as its chat settings say (`--no-guard` turns it off to see what the sampler alone does).
Prompt i uses seed 1000 + i, so a run repeats.

A reply loops when the engine's LoopGuard (engine/generator/loops.py) finds a loop in it: one sentence or
line, normalised (lowercase, list marker dropped, words only, 4+ words, outside code fences), occurring 4
or more times, or the reply's tokens ending in one block of p <= 64 tokens repeated over at least 4
copies and 48 tokens. A reply the guard stopped (eos_reason "repetition") counts as looped: it had
started to. The check reads each whole reply after it ends, so it counts loops the same way whether or
not the guard ran.
"""
from __future__ import annotations

import argparse
import json
import time

PROMPTS = (
    "Explain how a rainbow forms, in simple words.",
    "Give me a list of ten healthy breakfast ideas.",
    "Write a short poem about the sea at night.",
    "I can't sleep well lately. Any advice?",
    "Write a Python function that checks whether a string is a palindrome.",
    "Tell me a short story about a lost dog who finds its way home.",
    "What is the difference between weather and climate?",
    "List the planets of the solar system with one fact about each.",
    "Write a poem about the soul and the rhythm of life.",
    "How can I save money on groceries?",
    "Write a JavaScript function that returns the largest number in an array.",
    "Tell me a bedtime story about a dragon who is afraid of the dark.",
    "Why is the sky blue?",
    "What are some tips for a job interview?",
    "Write a haiku about autumn leaves.",
    "Give me a simple recipe for pancakes.",
    "Explain what a computer's memory does.",
    "How do I start running if I've never exercised?",
    "Write a short story about a robot learning to paint.",
    "Write a SQL query that counts the orders per customer in an orders table.",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default=None, help="a built-in preset (default: the app's default preset)")
    parser.add_argument("--n", type=int, default=20, help="how many of the prompts to run (1-20)")
    parser.add_argument("--no-guard", action="store_true", help="run without the loop guard")
    parser.add_argument("--json", default=None, help="write every reply and its verdict to this file")
    args = parser.parse_args(argv)

    import engine
    from app.core.presets import BUILTIN_PRESETS, DEFAULT_PRESET, apply_preset
    from app.core.store import ChatSettings
    from app.local.chat_prompt import encode, prompt_text
    from engine.contract import DEFAULT_PAGE_SIZE
    from engine.generator.loops import LoopGuard

    preset = args.preset or DEFAULT_PRESET
    settings = apply_preset(ChatSettings(), BUILTIN_PRESETS[preset])
    guard = settings.stop_on_loops and not args.no_guard
    prompts = PROMPTS[: max(1, min(args.n, len(PROMPTS)))]

    model = engine.Model.load(None)
    tokenizer = engine.Tokenizer.load(None)
    pages = len(prompts) * ((256 + settings.max_new_tokens) // DEFAULT_PAGE_SIZE + 2)
    cache = engine.PagedCache(model, max_tokens=pages * DEFAULT_PAGE_SIZE, page_size=DEFAULT_PAGE_SIZE)
    generator = engine.DynamicGenerator(model=model, cache=cache, tokenizer=tokenizer)
    stops = sorted(tokenizer.stop_token_ids) + list(settings.stop_strings)
    options = {"stop_on_loops": True} if guard else {}
    for i, prompt in enumerate(prompts):
        ids = encode(tokenizer, prompt_text(tokenizer, [{"role": "user", "content": prompt}], settings))
        generator.enqueue(engine.DynamicJob(
            input_ids=ids, max_new_tokens=settings.max_new_tokens, gen_settings=settings.sampler_settings(),
            seed=1000 + i, stop_conditions=stops, identifier=i, **options))

    print(f"preset {preset!r}, loop guard {'on' if guard else 'off'}, {len(prompts)} prompts at once: "
          f"{settings.sampler_settings()}", flush=True)
    start = time.perf_counter()
    tokens: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    ends: dict[int, dict] = {}
    while generator.num_remaining_jobs():
        for r in generator.iterate():
            if r["stage"] == "streaming":
                tokens[r["identifier"]] += r.get("token_ids", [])
                if r["eos"]:
                    ends[r["identifier"]] = r
    seconds = time.perf_counter() - start

    looped = 0
    rows = []
    for i, prompt in enumerate(prompts):
        end = ends[i]
        check = LoopGuard()
        loop = check.feed(tokens[i], end["full_completion"]) or end["eos_reason"] == "repetition"
        looped += loop
        what = check.found or ("stopped by the guard" if loop else "")
        print(f"{i:2d} {len(tokens[i]):5d} tokens  looped {'yes' if loop else 'no ':3s}  "
              f"{end['eos_reason']:14s} {prompt[:48]:48s} {what}", flush=True)
        rows.append({"prompt": prompt, "tokens": len(tokens[i]), "looped": loop, "found": check.found,
                     "eos_reason": end["eos_reason"], "reply": end["full_completion"]})
    print(f"{looped} of {len(prompts)} replies looped ({seconds:.0f} s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"preset": preset, "guard": guard, "looped": looped, "replies": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
