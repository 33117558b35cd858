"""Tiny random vision-language models (Idefics3/SmolVLM, Gemma 3) written by transformers, for oracle tests
of the text side: pagedeck loads their language model and is fed image features transformers computes.

Weights get the spread of tests/tiny_models.py so logits are far from flat. The image token ids sit at the
top of the default tokenizer's vocabulary (the tiny text models share it).
"""
from __future__ import annotations

from pathlib import Path

import torch

from tests.tiny_models import WEIGHT_STD, default_tokenizer

IMAGE_SIZE, PATCH = 64, 8  # 8 x 8 patches per image
IDEFICS3_IMAGE_TOKENS = 16  # 64 patches, pixel shuffle by scale_factor 2 -> 16 tokens per image
GEMMA3_IMAGE_TOKENS = 16  # mm_tokens_per_image: 8 x 8 patches pooled to 4 x 4


def _text(vocab: int, **extra) -> dict:
    return {**dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                   rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=2), **extra}


def _vision() -> dict:
    return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                image_size=IMAGE_SIZE, patch_size=PATCH)


def _spread(model, gemma: bool, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "vision" in name or "connector" in name or "projector" in name:
                p.normal_(0.0, 0.1) if p.dim() > 1 else p.uniform_(0.5, 1.5) if "norm" in name else p.zero_()
            elif "norm" in name:
                p.uniform_(-0.5, 0.5) if gemma else p.uniform_(0.5, 1.5)
            elif gemma and "embed_tokens" in name:
                p.normal_(0.0, WEIGHT_STD / 4)
            else:
                p.normal_(0.0, WEIGHT_STD if p.dim() > 1 else 0.5)


IDEFICS3_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"] + [
    f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
GEMMA3_TOKENS = ["<start_of_image>", "<end_of_image>", "<image_soft_token>", "<start_of_turn>", "<end_of_turn>"]
# SmolVLM-Instruct's chat template, and Gemma 3's (its image and text parts; no system-prompt folding)
IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]['type'] == "
    "'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == 'text' %}"
    "{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' "
    "else message['role']) + '\n' }}{%- if message['content'] is string -%}{{ message['content'] | trim }}{%- else -%}"
    "{%- for item in message['content'] -%}{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}{%- elif "
    "item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}")


def write_vlm_tokenizer(folder: str | Path, special: list[str], template: str) -> int:
    """The default tokenizer plus a VLM's special tokens and its chat template, into folder; returns the
    vocabulary size."""
    import json

    from tokenizers import AddedToken, Tokenizer as HFTokenizer

    folder = Path(folder)
    default_tokenizer().save(folder)
    tok = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.save(str(folder / "tokenizer.json"))
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = template
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return tok.get_vocab_size()


def write_tiny_idefics3(folder: str | Path, seed: int = 0, tie: bool = False, **text: object):
    """An Idefics3ForConditionalGeneration (SmolVLM's architecture) folder with a tokenizer that knows the
    image tokens and SmolVLM's chat template; returns (path, the HF model)."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    folder = Path(folder)
    vocab = write_vlm_tokenizer(folder, IDEFICS3_TOKENS, IDEFICS3_TEMPLATE)
    image_id = default_tokenizer().vocab_size + 1  # "<image>"
    cfg = Idefics3Config(vision_config=_vision(), text_config=_text(vocab, model_type="llama", tie_word_embeddings=tie, **text),
                         scale_factor=2, image_token_id=image_id, tie_word_embeddings=tie)
    model = Idefics3ForConditionalGeneration(cfg).eval()
    _spread(model, False, seed)
    if tie:
        model.tie_weights()
    model.save_pretrained(folder)
    return folder, model


def write_tiny_gemma3_vlm(folder: str | Path, seed: int = 0):
    """A Gemma3ForConditionalGeneration folder (six text layers, five sliding) with a tokenizer that knows
    the image tokens and Gemma 3's chat template; returns (path, the HF model)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    folder = Path(folder)
    vocab = write_vlm_tokenizer(folder, GEMMA3_TOKENS, GEMMA3_TEMPLATE)
    base = default_tokenizer().vocab_size
    text = _text(vocab, num_hidden_layers=6, sliding_window=16, query_pre_attn_scalar=16,
                 rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                  "full_attention": {"rope_type": "default", "rope_theta": 1e6}})
    cfg = Gemma3Config(text_config=text, vision_config={**_vision(), "model_type": "siglip_vision_model"},
                       mm_tokens_per_image=GEMMA3_IMAGE_TOKENS, boi_token_index=base, eoi_token_index=base + 1,
                       image_token_index=base + 2)
    model = Gemma3ForConditionalGeneration(cfg).eval()
    _spread(model, True, seed)
    model.save_pretrained(folder)
    return folder, model


def pixels(seed: int, n: int = 1) -> torch.Tensor:
    """n random images' pixel values (n, 3, IMAGE_SIZE, IMAGE_SIZE), as a processor's output."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand((n, 3, IMAGE_SIZE, IMAGE_SIZE), generator=g) * 2 - 1


@torch.no_grad()
def idefics3_features(model, pixel_values: torch.Tensor) -> torch.Tensor:
    """(n_images * 16, hidden) image features of (n, 3, H, W) pixels, by transformers."""
    pv = pixel_values.unsqueeze(0)  # (batch 1, n images, 3, H, W)
    mask = torch.ones((1, pv.shape[1], IMAGE_SIZE, IMAGE_SIZE), dtype=torch.bool)
    out = model.get_image_features(pixel_values=pv, pixel_attention_mask=mask)
    feats = out.pooler_output if hasattr(out, "pooler_output") else out
    return torch.cat(list(feats)) if isinstance(feats, (list, tuple)) else feats.reshape(-1, feats.shape[-1])


@torch.no_grad()
def gemma3_features(model, pixel_values: torch.Tensor) -> torch.Tensor:
    """(n_images * 16, hidden) image features, by transformers."""
    out = model.get_image_features(pixel_values=pixel_values)
    feats = out.pooler_output if hasattr(out, "pooler_output") else out
    return feats.reshape(-1, feats.shape[-1])


def write_tiny_vlm_folder(folder: str | Path, kind: str = "idefics3", seed: int = 0, split: bool = True) -> Path:
    """A whole tiny VLM folder a real `python -m engine serve` or the app loads: the model, its tokenizer
    and its image processor's preprocessor_config.json (small sizes: Idefics3 scales an image to 256 px and
    splits it into 64 px tiles plus the global view; Gemma 3 reads 64 x 64)."""
    from transformers import Gemma3ImageProcessorPil, Idefics3ImageProcessorPil

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "idefics3":
        write_tiny_idefics3(folder, seed, max_position_embeddings=2048)  # room for a few 256 px images
        processor = Idefics3ImageProcessorPil(size={"longest_edge": 4 * IMAGE_SIZE},
                                              max_image_size={"longest_edge": IMAGE_SIZE}, do_image_splitting=split)
    else:
        write_tiny_gemma3_vlm(folder, seed)
        processor = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor.save_pretrained(folder)
    return folder


def write_gguf_pair(hf_folder: str | Path, out_folder: str | Path, stem: str, dtype: str = "f32") -> tuple[Path, Path]:
    """The pair LM Studio downloads for a VLM, from an HF VLM folder: `<stem>.gguf` (the language model and
    tokenizer, tools.models.vlm_gguf) and `mmproj-<stem>.gguf` (the vision side, tools.models.mmproj_gguf) in out_folder
    (LM Studio keeps them in models/<publisher>/<model>/)."""
    from tools.models.mmproj_gguf import write_mmproj
    from tools.models.vlm_gguf import write_vlm_text_gguf

    out_folder = Path(out_folder)
    out_folder.mkdir(parents=True, exist_ok=True)
    model = write_vlm_text_gguf(hf_folder, out_folder / f"{stem}.gguf", dtype)
    return model, write_mmproj(hf_folder, out_folder / f"mmproj-{stem}.gguf", dtype)


def write_ollama_store(root: str | Path, model_gguf: Path, projector_gguf: Path, name: str = "tiny-vlm") -> Path:
    """An Ollama model store (OLLAMA_MODELS) holding one VLM: its GGUF and projector as content-addressed
    blobs and the manifest listing them as the model and projector layers; returns the model's blob."""
    import hashlib
    import json
    import shutil

    root = Path(root)
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    layers = []
    for path, media in ((model_gguf, "model"), (projector_gguf, "projector")):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, root / "blobs" / f"sha256-{digest}")
        layers.append({"mediaType": f"application/vnd.ollama.image.{media}", "digest": f"sha256:{digest}",
                       "size": path.stat().st_size})
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / name / "latest"
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return root / "blobs" / layers[0]["digest"].replace(":", "-")
