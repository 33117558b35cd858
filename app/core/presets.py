"""Sampler presets: named sets of sampler values a chat's settings can take in one click.

A preset holds sampler knobs only (never the system prompt, length, seed or stops), so applying one keeps
what the chat is about and changes only how it samples. The built-ins are fixed; users save their own
(stored by app.preferences.preferences).
"""
from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any, Mapping

from app.core.chat_settings import ADVANCED_SAMPLER_FIELDS, ChatSettings

PRESET_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty") + ADVANCED_SAMPLER_FIELDS
_DEFAULTS = {name: getattr(ChatSettings(), name) for name in PRESET_FIELDS}

# Every built-in keeps the chat default's DRY (chat_settings.LOOP_SAFE_DRY): without it the small default model
# loops on everyday prompts, and a low temperature (Precise) loops the most.
BUILTIN_PRESETS: dict[str, dict[str, Any]] = {
    # Near-deterministic: facts, code, extraction.
    "Precise": {**_DEFAULTS, "temperature": 0.2, "top_k": 40, "top_p": 0.9, "min_p": 0.05,
                "repetition_penalty": 1.0},
    # The chat defaults: the engine's (ExLlamaV2's chat sampler) plus DRY.
    "Balanced": dict(_DEFAULTS),
    # Varied wording: high temperature kept sane by min-p; XTC drops the most obvious choice now and then.
    "Creative": {**_DEFAULTS, "temperature": 1.1, "top_k": 0, "top_p": 1.0, "min_p": 0.05,
                 "repetition_penalty": 1.0, "xtc_probability": 0.5, "xtc_threshold": 0.1},
}
DEFAULT_PRESET = "Balanced"


def preset_of(settings: ChatSettings) -> dict[str, Any]:
    """The sampler values of `settings`, as a preset."""
    values = asdict(settings)
    return {name: values[name] for name in PRESET_FIELDS}


def apply_preset(settings: ChatSettings, values: Mapping[str, Any]) -> ChatSettings:
    """`settings` with a preset's sampler values (ValueError naming an unknown or invalid field)."""
    unknown = sorted(set(values) - set(PRESET_FIELDS))
    if unknown:
        raise ValueError(f"a preset holds sampler settings only; unknown field(s) {unknown}")
    return replace(settings, **values).validate()


def matching_preset(settings: ChatSettings, presets: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The name of the preset whose values `settings` has exactly (None: custom values)."""
    mine = preset_of(settings)
    return next((name for name, values in presets.items() if {**_DEFAULTS, **values} == mine), None)
