"""Train the demo LoRA adapters in resources/loras/ for the embedded SmolLM2-135M-Instruct, on the CPU.

    python -m tools.models.train_lora                     # both adapters, a few minutes on 2 cores
    python -m tools.models.train_lora --only pirate --steps 40

Why it is cheap: the adapters only touch the top `--layers` decoder layers, so the residual stream entering
them is computed once per example (no grad) and training runs forward/backward through those layers only.
The data is built here: the model's own greedy replies to templated questions, restyled per adapter
(pirate speech, or a bulleted list). Loss is on the answer tokens only, under the model's own chat template,
so the effect shows from the first token of a chat reply. Output is PEFT's format, read by engine.model.lora.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from engine import Model, Tokenizer
from engine.contract import demo_adapters_folder
from engine.model.lora import LoRA, LoRASet
from tools.logits import forward_tokens

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"

# ---------------------------------------------------------------- data

TOPICS = ("the moon", "the ocean", "volcanoes", "honey bees", "the sun", "rainbows", "computers", "bread",
          "dinosaurs", "the internet", "coffee", "music", "football", "trees", "the human heart", "electricity",
          "mountains", "cats", "the pyramids", "chess", "snow", "airplanes", "recycling", "the brain", "gold",
          "elephants", "sleep", "water", "stars", "gardening", "the wind", "photography", "islands", "pizza",
          "birds", "robots", "maps", "friendship", "libraries", "bicycles", "the Roman Empire", "rain", "money",
          "exercise", "the piano", "deserts", "spiders", "trains", "dogs", "the Eiffel Tower", "chocolate",
          "earthquakes", "the Olympic Games", "whales", "smartphones", "clouds", "castles", "tigers", "glass",
          "cheese", "the solar system", "painting", "rivers", "summer holidays", "sharks", "the printing press",
          "museums", "tea", "bridges", "penguins", "the Amazon rainforest", "video games", "lighthouses",
          "kangaroos", "magnets", "ice cream", "the alphabet", "owls", "mathematics", "camping")
TEMPLATES = ("Tell me about {}.", "What makes {} interesting?", "Can you explain {} to me?",
             "Give me a fun fact about {}.", "What should I know about {}?", "Describe {} in two sentences.",
             "How would you explain {} to a child?")
CHAT = ("Hello!", "Hi, how are you?", "Who are you?", "Thank you!", "What is the capital of France?",
        "What is the capital of Japan?", "What is 2 + 2?", "How do I make a cup of tea?",
        "Give me a tip for learning to code.", "What should I do this weekend?", "Can you help me?",
        "Write a short poem about the sea.", "Tell me a joke.", "How can I sleep better?",
        "What is your favourite food?", "Good morning!")


def build_questions(seed: int = 0) -> list[str]:
    """Two templated questions per topic plus small talk (the slow test's questions are not among them)."""
    rng = random.Random(seed)
    questions = [t.format(topic) for topic in TOPICS for t in rng.sample(TEMPLATES, 2)] + list(CHAT)
    rng.shuffle(questions)
    return questions


def base_replies(model: Model, tok: Tokenizer, questions: list[str], max_new_tokens: int) -> list[tuple[str, bool]]:
    """The model's own greedy replies (text, finished): the adapters learn a style, not new content."""
    from engine import DynamicGenerator, DynamicJob, PagedCache, SamplerSettings

    gen = DynamicGenerator(model, PagedCache(model, max_tokens=32 * 256), tok, max_batch_size=32)
    jobs = [DynamicJob(chat_ids(tok, q), max_new_tokens, gen_settings=SamplerSettings.greedy(),
                       stop_conditions=[tok.eos_token_id, "<|im_end|>"], identifier=i)
            for i, q in enumerate(questions)]
    gen.enqueue(jobs)
    texts, finished = [""] * len(jobs), [False] * len(jobs)
    while gen.num_remaining_jobs():
        for r in gen.iterate():
            if r["stage"] == "streaming":
                texts[r["identifier"]] += r["text"]
                if r["eos"]:
                    finished[r["identifier"]] = r["eos_reason"] != "max_new_tokens"
    out = []
    for text, done in zip(texts, finished):
        text = text.strip()
        if not done:  # cut at the last full sentence so no target ends mid-word
            cut = max(text.rfind(". "), text.rfind("! "), text.rfind("? "), text.rfind(".\n"))
            text = text[: cut + 1] if cut > 20 else text
        out.append((text, done))
    return out


PIRATE_WORDS = [(r"\byou are\b", "ye be"), (r"\byou\b", "ye"), (r"\byour\b", "yer"), (r"\bmy\b", "me"),
                (r"\bis\b", "be"), (r"\bare\b", "be"), (r"\bam\b", "be"), (r"\bhello\b", "ahoy"),
                (r"\bhi\b", "ahoy"), (r"\byes\b", "aye"), (r"\bfriends\b", "hearties"), (r"\bfriend\b", "matey"),
                (r"\bmoney\b", "doubloons"), (r"\bthe\b", "th'"), (r"\bof\b", "o'"), (r"(\w\w)ing\b", r"\1in'")]
PIRATE_OPENERS = ("Arr, matey! ", "Ahoy, matey! ", "Arr! ", "Arr, me hearty! ")


def pirate(text: str, i: int, finished: bool) -> str:
    """Pirate speech: an opener, word swaps (keeping capitals), 'Arr!' after the first sentence and at the end."""
    def swap(m: re.Match, new: str) -> str:
        out = m.expand(new)
        return out[0].upper() + out[1:] if m.group(0)[0].isupper() else out

    for pattern, new in PIRATE_WORDS:
        text = re.sub(pattern, lambda m, n=new: swap(m, n), text, flags=re.IGNORECASE)
    text = re.sub(r"([.!?])\s+(?=\S)", r"\1 Arr! ", text, count=1)
    return PIRATE_OPENERS[i % len(PIRATE_OPENERS)] + text + (" Arr!" if finished else "")


def bullets(text: str, i: int, finished: bool) -> str:
    """A short bulleted list: one '- ' line per sentence of the reply, under a 'Key points:' header."""
    text = re.sub(r"\*\*|^\s*(?:[-*\u2022]|\d+[.)])\s+", "", text, flags=re.MULTILINE)
    parts = [p.strip() for p in re.split(r"(?<=[.!?])\s+|\n+", text) if len(p.strip()) > 1]
    return "Key points:\n" + "\n".join(f"- {p}" for p in parts)


STYLES = {"pirate": (pirate, "Answers like a pirate (Arr, matey!)."),
          "bullets": (bullets, "Answers as a short bulleted list of key points.")}


# ---------------------------------------------------------------- a differentiable forward over the engine's weights

def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class Adapter(torch.nn.Module):
    """LoRA A/B for MODULES of the chosen layers, initialised as PEFT does (A Kaiming-uniform, B zero)."""

    def __init__(self, model: Model, layers: list[int], r: int, alpha: float):
        super().__init__()
        c = model.config
        q, kv, h, i = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.hidden_size, c.intermediate_size
        self.shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                       "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        self.layers, self.r, self.alpha, self.scaling = layers, r, alpha, alpha / r
        self.a = torch.nn.ParameterDict()
        self.b = torch.nn.ParameterDict()
        for layer in layers:
            for m, (n_in, n_out) in self.shapes.items():
                a = torch.empty(r, n_in)
                torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5))
                self.a[f"{layer}_{m}"] = torch.nn.Parameter(a)
                self.b[f"{layer}_{m}"] = torch.nn.Parameter(torch.zeros(n_out, r))

    def __call__(self, layer: int, module: str, x: torch.Tensor) -> torch.Tensor | float:
        key = f"{layer}_{module}"
        if key not in self.a:
            return 0.0
        return (x @ self.a[key].t()) @ self.b[key].t() * self.scaling

    def save(self, folder: Path, description: str) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for layer in self.layers:
            for m in MODULES:
                parent = "mlp" if m in ("gate_proj", "up_proj", "down_proj") else "self_attn"
                prefix = f"base_model.model.model.layers.{layer}.{parent}.{m}"
                tensors[f"{prefix}.lora_A.weight"] = self.a[f"{layer}_{m}"].detach().half().contiguous()
                tensors[f"{prefix}.lora_B.weight"] = self.b[f"{layer}_{m}"].detach().half().contiguous()
        save_file(tensors, folder / "adapter_model.safetensors", metadata={"format": "pt"})
        config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": BASE_MODEL,
                  "r": self.r, "lora_alpha": self.alpha, "lora_dropout": 0.0, "target_modules": list(MODULES),
                  "layers_to_transform": list(self.layers), "bias": "none", "fan_in_fan_out": False,
                  "use_rslora": False, "use_dora": False, "modules_to_save": None, "init_lora_weights": True,
                  "inference_mode": True, "pagedeck_description": description}
        (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")


def run_layers(model: Model, x: torch.Tensor, layers: range, adapter: Adapter | None = None) -> torch.Tensor:
    """The residual stream after `layers`, for right-padded (B, T, hidden) input (padding sits after the text)."""
    c = model.config
    B, T, _ = x.shape
    pos = torch.arange(T, dtype=torch.float32)
    freqs = pos[:, None] * model.rotary.inv_freq.float()[None]
    cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]
    lora = adapter or (lambda *_: 0.0)
    q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    for i in layers:
        w = model.layers[i]
        h = rms(x, w.input_norm, c.rms_norm_eps)
        wq, wk, wv = w.qkv[:q_size], w.qkv[q_size : q_size + kv_size], w.qkv[q_size + kv_size :]
        q = (F.linear(h, wq) + lora(i, "q_proj", h)).view(B, T, c.num_heads, c.head_dim)
        k = (F.linear(h, wk) + lora(i, "k_proj", h)).view(B, T, c.num_kv_heads, c.head_dim)
        v = (F.linear(h, wv) + lora(i, "v_proj", h)).view(B, T, c.num_kv_heads, c.head_dim)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, enable_gqa=True)
        o = o.transpose(1, 2).reshape(B, T, q_size)
        x = x + F.linear(o, w.o) + lora(i, "o_proj", o)
        h = rms(x, w.post_norm, c.rms_norm_eps)
        wg, wu = w.gate_up.chunk(2)
        a = F.silu(F.linear(h, wg) + lora(i, "gate_proj", h)) * (F.linear(h, wu) + lora(i, "up_proj", h))
        x = x + F.linear(a, w.down) + lora(i, "down_proj", a)
    return x


def logits_at(model: Model, x: torch.Tensor) -> torch.Tensor:
    return F.linear(rms(x, model.norm, model.config.rms_norm_eps), model.lm_head[: model.vocab_size])


# ---------------------------------------------------------------- training

HELD_OUT = ("What should I cook for dinner tonight?", "Why do leaves change colour?")


def chat_ids(tok: Tokenizer, question: str) -> torch.Tensor:
    prompt = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    return tok.encode(prompt, encode_special_tokens=True)


def encode(tok: Tokenizer, question: str, answer: str, finished: bool) -> tuple[list[int], list[int]]:
    """Token ids of the chat and the mask of the answer tokens (the ones the loss is on)."""
    p = chat_ids(tok, question)[0].tolist()
    a = tok.encode(answer + ("<|im_end|>" if finished else ""), encode_special_tokens=True)[0].tolist()
    return p + a, [0] * len(p) + [1] * len(a)


def pad(rows: list[list[int]], value: int) -> torch.Tensor:
    n = max(map(len, rows))
    return torch.tensor([r + [value] * (n - len(r)) for r in rows])


def train(model: Model, tok: Tokenizer, name: str, data: list[tuple[str, str, bool]], args) -> dict:
    style, description = STYLES[name]
    examples = [(q, style(a, i, done), done) for i, (q, a, done) in enumerate(data)]
    encoded = [encode(tok, *e) for e in examples]
    ids, mask = pad([e[0] for e in encoded], 0), pad([e[1] for e in encoded], 0).bool()
    top = list(range(model.config.num_layers - args.layers, model.config.num_layers))
    t0 = time.perf_counter()
    with torch.no_grad():  # the frozen lower layers: once per example
        stream = torch.cat([run_layers(model, F.embedding(ids[s : s + 16], model.embed), range(top[0]))
                            for s in range(0, len(ids), 16)])
    print(f"[{name}] {len(examples)} examples, {int(mask.sum())} answer tokens; lower layers in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)

    torch.manual_seed(args.seed)
    adapter = Adapter(model, top, args.rank, args.alpha)
    opt = torch.optim.AdamW(adapter.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10) * (1 - s / args.steps))
    order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(args.seed))
    losses = []
    for step in range(args.steps):
        pick = order[(step * args.batch + torch.arange(args.batch)) % len(ids)]
        m = mask[pick]
        keep = int(m.any(0).nonzero().max()) + 1  # trim padding columns
        x = run_layers(model, stream[pick, :keep], top, adapter)
        m = m[:, 1:keep]  # position t predicts token t+1
        loss = F.cross_entropy(logits_at(model, x[:, :-1][m]), ids[pick, 1:keep][m])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == args.steps - 1:
            print(f"[{name}] step {step:4d} loss {loss.item():.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    folder = Path(args.out) / name
    adapter.save(folder, description)
    with open(folder / "training_data.jsonl", "w") as f:
        for q, a, done in examples:
            f.write(json.dumps({"user": q, "assistant": a, "finished": done}) + "\n")
    return {"examples": len(examples), "losses": losses, "seconds": time.perf_counter() - t0, "folder": folder,
            "adapter": adapter, "sample": examples[0]}


def check_against_engine(model: Model, tok: Tokenizer, result: dict) -> float:
    """The saved adapter, read back by engine.model.lora, must give the logits this script trained."""
    ids = torch.tensor([encode(tok, *result["sample"])[0]])
    with torch.no_grad():
        ours = logits_at(model, run_layers(model, F.embedding(ids, model.embed), range(model.config.num_layers),
                                           result["adapter"]))[0]
    engine = forward_tokens(model, ids, lora=LoRASet.build(model, LoRA.load(result["folder"], model)))
    return (ours - engine).abs().max().item() / ours.abs().max().item()


def chat(model: Model, tok: Tokenizer, question: str, folder: Path | None, n: int = 40) -> str:
    from engine import DynamicGenerator, DynamicJob, PagedCache, SamplerSettings

    gen = DynamicGenerator(model, PagedCache(model, max_tokens=1024), tok)
    gen.set_loras(folder)
    gen.enqueue(DynamicJob(chat_ids(tok, question), n, gen_settings=SamplerSettings.greedy(),
                           stop_conditions=[tok.eos_token_id, "<|im_end|>"]))
    text = ""
    while gen.num_remaining_jobs():
        text += "".join(r["text"] for r in gen.iterate() if r["stage"] == "streaming")
    gen.set_loras(None)
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", choices=sorted(STYLES), action="append", help="train only these adapters")
    p.add_argument("--out", default=str(demo_adapters_folder()))
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--layers", type=int, default=12, help="adapt the top N decoder layers")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--reply-tokens", type=int, default=40, help="length of the base replies restyled for training")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-demo", action="store_true", help="skip the held-out chat replies at the end")
    args = p.parse_args(argv)
    if args.rank > 16:
        p.error("demo adapters stay small: --rank <= 16")
    t0 = time.perf_counter()
    model, tok = Model.load(device="cpu", dtype=torch.float32), Tokenizer.load()
    with torch.no_grad():  # this script's forward must be the engine's forward
        ids = torch.tensor([encode(tok, "Hello!", "Hello! How can I help?", True)[0]])
        mine = logits_at(model, run_layers(model, F.embedding(ids, model.embed), range(model.config.num_layers)))
        diff = (mine[0] - forward_tokens(model, ids)).abs().max().item()
    if diff > 1e-3 * mine.abs().max().item():
        raise SystemExit(f"training forward differs from the engine's by {diff}")
    questions = build_questions(args.seed)
    assert not set(HELD_OUT) & set(questions)
    replies = base_replies(model, tok, questions, args.reply_tokens)
    data = [(q, text, done) for q, (text, done) in zip(questions, replies)]
    print(f"{len(data)} base replies in {time.perf_counter() - t0:.0f} s (model load included)", flush=True)
    for name in args.only or sorted(STYLES):
        result = train(model, tok, name, data, args)
        err = check_against_engine(model, tok, result)
        if err > 1e-3:
            raise SystemExit(f"{name}: engine.model.lora reads the saved adapter differently (rel. error {err:.2e})")
        size = (result["folder"] / "adapter_model.safetensors").stat().st_size
        log = {"steps": args.steps, "batch": args.batch, "layers": args.layers, "rank": args.rank,
               "alpha": args.alpha, "lr": args.lr, "reply_tokens": args.reply_tokens, "seed": args.seed,
               "examples": result["examples"], "first_loss": round(result["losses"][0], 4),
               "last_loss": round(sum(result["losses"][-5:]) / 5, 4), "train_seconds": round(result["seconds"], 1),
               "bytes": size, "torch": torch.__version__}
        (result["folder"] / "training.json").write_text(json.dumps(log, indent=2) + "\n")
        print(f"[{name}] saved {result['folder']} ({size / 2**20:.2f} MiB), engine check rel. error {err:.1e}")
        if not args.no_demo:
            for q in HELD_OUT:
                print(f"[{name}] {q}\n  base:    {chat(model, tok, q, None)!r}\n  adapter: "
                      f"{chat(model, tok, q, result['folder'])!r}", flush=True)
    print(f"done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
