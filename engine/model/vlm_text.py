"""The language model inside a vision-language checkpoint: its config and its tensor names.

pagedeck's decoder runs the text side of VLM folders; the vision tower and projector are read by the
vision encoders. Two layouts are known:
- Idefics3 / SmolVLM (`Idefics3ForConditionalGeneration`): config.text_config (a Llama), decoder weights
  under `model.text_model.*`, the head as `lm_head.weight`, the tower under `model.vision_model.*` and the
  projector under `model.connector.*`.
- Gemma 3 4B+ (`Gemma3ForConditionalGeneration`): config.text_config (gemma3_text), decoder weights under
  `language_model.model.*` (transformers 4) or `model.language_model.*` (5), the tower under
  `vision_tower.*` and the projector under `multi_modal_projector.*`.
"""
from __future__ import annotations

# checkpoint prefix -> the decoder's own prefix (longest first where they overlap)
TEXT_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                 ("language_model.lm_head.", "lm_head."), ("model.text_model.", "model."))
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.",
                   "model.vision_model.", "model.connector.")
# model_type of a VLM config -> model_type of the text decoder it wraps, when text_config doesn't say
VLM_TEXT_TYPES = {"gemma3": "gemma3_text", "idefics3": "llama", "smolvlm": "llama"}
_TOP_LEVEL_KEYS = ("tie_word_embeddings", "eos_token_id", "bos_token_id")


def is_vlm_config(cfg: dict) -> bool:
    return cfg.get("model_type") in VLM_TEXT_TYPES and isinstance(cfg.get("text_config"), dict)


def text_config(cfg: dict) -> dict:
    """The decoder's config of a VLM config.json (unchanged for a text model): text_config, with eos/bos
    from the outer config where text_config lacks them, and the outer tie_word_embeddings where present."""
    if not is_vlm_config(cfg):
        return cfg
    text = cfg["text_config"]
    outer = {k: v for k, v in cfg.items() if k in _TOP_LEVEL_KEYS}
    merged = {**outer, **text, "model_type": text.get("model_type") or VLM_TEXT_TYPES[cfg["model_type"]]}
    if "tie_word_embeddings" in outer:  # transformers 5 ties the head by the outer config's flag
        merged["tie_word_embeddings"] = outer["tie_word_embeddings"]
    return merged


def text_name(name: str) -> str | None:
    """The decoder's name for a checkpoint tensor name; None for vision-tower and projector tensors."""
    if name.startswith(VISION_PREFIXES):
        return None
    for prefix, replacement in TEXT_PREFIXES:
        if name.startswith(prefix):
            return replacement + name[len(prefix):]
    return name
