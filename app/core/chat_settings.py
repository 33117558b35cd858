"""ChatSettings: one chat's system prompt, sampler settings, adapters, model and tools, and their one check.

The sampler fields are the engine's (SamplerSettings under the same names, checked by its one rule set),
with DRY on by default (LOOP_SAFE_DRY). The store keeps them as JSON per chat (to_json, from_json).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from app.core.context_window import POLICIES, ROLLING_WINDOW, STOP_AT_LIMIT, TRUNCATE_MIDDLE
from engine.chat.harmony import DEFAULT_REASONING_EFFORT, REASONING_EFFORTS
from engine.contract import SamplerSettings, check_lora_pairs

_ENGINE = SamplerSettings()  # the engine's sampler defaults (ExLlamaV2's)
# DRY as llama.cpp, koboldcpp and SillyTavern recommend it: small models otherwise fall into loops (the same
# sentence until max_new_tokens); measured with tools/bench/loop_check.py. The engine keeps DRY off by default
# (ExLlamaV2's and the server's OpenAI semantics); a chat turns it on.
LOOP_SAFE_DRY = {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2}
ADVANCED_SAMPLER_FIELDS = ("dry_multiplier", "dry_base", "dry_allowed_length", "mirostat", "mirostat_tau",
                           "mirostat_eta", "xtc_probability", "xtc_threshold")


@dataclass(frozen=True)
class ChatSettings:
    """Per-chat system prompt and sampler settings: the engine's sampler defaults plus DRY (LOOP_SAFE_DRY),
    and the engine's loop guard on.

    Stored chats keep the values they were saved with (every field is stored), so a chat saved before DRY
    was the default keeps DRY off; a field a stored chat lacks takes its default here (from_json)."""

    system_prompt: str = "You are a helpful assistant."
    temperature: float = _ENGINE.temperature
    top_k: int = _ENGINE.top_k
    top_p: float = _ENGINE.top_p
    min_p: float = _ENGINE.min_p
    repetition_penalty: float = _ENGINE.token_repetition_penalty
    max_new_tokens: int | None = None  # None: until the context is full (the engine takes pages as a reply grows)
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    # When the chat outgrows the model's context (app.core.context_window): leave out whole turns from the
    # middle (LM Studio's default), keep only the latest turns, or stop with a message. The prompt only:
    # the stored history never changes.
    context_overflow: str = TRUNCATE_MIDDLE
    # The engine's advanced samplers (neutral by default but DRY), passed to SamplerSettings under the same names.
    dry_multiplier: float = LOOP_SAFE_DRY["dry_multiplier"]
    dry_base: float = LOOP_SAFE_DRY["dry_base"]
    dry_allowed_length: int = LOOP_SAFE_DRY["dry_allowed_length"]
    mirostat: bool = _ENGINE.mirostat
    mirostat_tau: float = _ENGINE.mirostat_tau
    mirostat_eta: float = _ENGINE.mirostat_eta
    xtc_probability: float = _ENGINE.xtc_probability
    xtc_threshold: float = _ENGINE.xtc_threshold
    json_mode: bool = False  # the reply is one JSON object (the engine's JSONSchemaFilter)
    # End a reply stuck repeating itself (the engine's stop_on_loops: eos_reason "repetition"). Local model only.
    stop_on_loops: bool = True
    # LoRA adapters (loaded adapters' names) and scales this chat's replies run with; None: the LoRA
    # panel's default set, (): the base model. Per job: chats with different adapters share a batch.
    loras: tuple[tuple[str, float], ...] | None = None
    # The model this chat's replies run on: the path of a model loaded beside the main one (compare mode),
    # None: the main model (whatever is loaded).
    model: str | None = None
    # MCP tools this chat's model may call, as "server/tool" keys (app.agent); each call is approved first.
    tools: tuple[str, ...] = ()
    # Let a reasoning model think before answering, where its template has the switch (Qwen3's enable_thinking).
    thinking: bool = True
    # How hard a harmony model (gpt-oss) thinks: low, medium or high, said in its system message.
    reasoning_effort: str = DEFAULT_REASONING_EFFORT

    def sampler_settings(self) -> SamplerSettings:
        """The engine's SamplerSettings for these chat settings."""
        return SamplerSettings(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                               token_repetition_penalty=self.repetition_penalty,
                               **{name: getattr(self, name) for name in ADVANCED_SAMPLER_FIELDS})

    def validate(self) -> "ChatSettings":
        """Raise ValueError naming the first bad field; return self so calls can chain.

        Sampler fields follow the engine's one rule set (SamplerSettings.validate), so a chat can never hold
        a setting the engine would refuse, or refuse one the engine takes."""
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"chat setting {name}={getattr(self, name)!r}: {why}")

        try:
            self.sampler_settings().validate()
        except ValueError as exc:
            raise ValueError(f"chat setting {exc}") from None
        if not isinstance(self.system_prompt, str):
            raise bad("system_prompt", "must be a string")
        if self.max_new_tokens is not None and (isinstance(self.max_new_tokens, bool)
                                                or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1):
            raise bad("max_new_tokens", "must be None (until the context is full) or an int >= 1")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise bad("seed", "must be None (random) or an int >= 0")
        if not all(isinstance(s, str) and s for s in self.stop_strings):
            raise bad("stop_strings", "must be non-empty strings")
        if self.context_overflow not in POLICIES:
            raise bad("context_overflow", f"must be one of {', '.join(POLICIES)}")
        if not isinstance(self.json_mode, bool):
            raise bad("json_mode", "must be a bool")
        if not isinstance(self.stop_on_loops, bool):
            raise bad("stop_on_loops", "must be a bool")
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise bad("model", "must be None (the main model) or a model path")
        if not all(isinstance(t, str) and "/" in t for t in self.tools):
            raise bad("tools", 'must be "server/tool" names')
        if not isinstance(self.thinking, bool):
            raise bad("thinking", "must be a bool")
        if self.reasoning_effort not in REASONING_EFFORTS:
            raise bad("reasoning_effort", f"must be one of {', '.join(REASONING_EFFORTS)}")
        if self.loras is not None:
            try:
                check_lora_pairs(self.loras)  # the engine's one rule for (adapter name, scale) pairs
            except ValueError as exc:
                raise bad("loras", str(exc)) from None
        return self

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "ChatSettings":
        """Unknown keys (from a newer version) are dropped; missing ones take defaults. A chat saved with the
        earlier on/off "truncate" keeps what it did: on left out the oldest turns, off stopped at the limit."""
        raw = json.loads(text)
        if "context_overflow" not in raw and isinstance(raw.get("truncate"), bool):
            raw["context_overflow"] = ROLLING_WINDOW if raw["truncate"] else STOP_AT_LIMIT
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        if "stop_strings" in values:
            values["stop_strings"] = tuple(values["stop_strings"])
        if "tools" in values:
            values["tools"] = tuple(values["tools"])
        if values.get("loras") is not None:
            values["loras"] = tuple((n, float(sc)) for n, sc in values["loras"])
        return cls(**values).validate()
