"""Chats with images, the text side: template-shaped messages, and each family's image markers expanded
into the token text its HF processor builds, with the image-token runs that embeddings fill.

OpenAI-shaped messages carry images as content parts {"type": "image", "image": <PIL image>} beside
{"type": "text", "text": ...}; HF VLM chat templates take parts {"type": "image"} and emit one marker per
image, which the model's processor expands:
- Idefics3 / SmolVLM: "<image>" -> per tile "<fake_token_around_image><row_R_col_C>" + N x "<image>", a
  newline after each row of tiles, then "\\n<fake_token_around_image><global-img>" + N x "<image>" +
  "<fake_token_around_image>" (an image that isn't split: the global part alone, without newlines).
- Gemma 3: "<start_of_image>" -> "\\n\\n<start_of_image>" + N x "<image_soft_token>" + "<end_of_image>\\n\\n".
The expanded text is tokenized whole (as the processor does), and the image tokens, in order, are then
replaced by each image's placeholder ids (engine.generator.image_prompt does that part, with torch).
Torch-free: the app and the server can shape messages and count image tokens with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class ImageFamily:
    """How one VLM family marks and expands an image in its prompt text."""

    name: str
    marker: str  # what the chat template emits per image
    image_token: str  # the token the image's vectors replace, N per tile

    def expand(self, tokens_per_tile: int, rows: int = 0, cols: int = 0) -> str:
        """The processor's text for one image of rows x cols tiles (0, 0: not split) plus, for a split
        image, its global view; tokens_per_tile image tokens each."""
        run = self.image_token * tokens_per_tile
        if self.name == "gemma3":
            return f"\n\n<start_of_image>{run}<end_of_image>\n\n"
        fake, glob = "<fake_token_around_image>", "<global-img>"
        if not rows or not cols:
            return f"{fake}{glob}{run}{fake}"
        text = ""
        for r in range(rows):
            for c in range(cols):
                text += f"{fake}<row_{r + 1}_col_{c + 1}>{run}"
            text += "\n"
        return text + f"\n{fake}{glob}{run}{fake}"

    def tiles(self, rows: int, cols: int) -> int:
        """How many feature runs of tokens_per_tile an image of this grid has."""
        return rows * cols + 1 if rows and cols and self.name != "gemma3" else 1


IDEFICS3 = ImageFamily("idefics3", "<image>", "<image>")
GEMMA3 = ImageFamily("gemma3", "<start_of_image>", "<image_soft_token>")
FAMILIES = {"idefics3": IDEFICS3, "smolvlm": IDEFICS3, "gemma3": GEMMA3}


def image_family(model_type: str | None) -> ImageFamily:
    """The family of a VLM's config.json model_type; ValueError for a model that takes no images."""
    family = FAMILIES.get(model_type or "")
    if family is None:
        raise ValueError(f"model type {model_type!r} takes no images here; supported: {', '.join(sorted(FAMILIES))}")
    return family


def split_images(messages: list[dict]) -> tuple[list[dict], list[Any]]:
    """(messages for a VLM chat template, the images in prompt order).

    Every content becomes a list of parts (the templates iterate parts; a plain string turns into one
    text part); image parts lose their image object ({"type": "image"}), which is returned apart."""
    out: list[dict] = []
    images: list[Any] = []
    for m in messages:
        content = m.get("content")
        if content is None or isinstance(content, str):
            parts = [{"type": "text", "text": content or ""}]
        else:
            parts = []
            for part in content:
                kind = part.get("type")
                if kind == "image":
                    if part.get("image") is None:
                        raise ValueError("an image part needs its decoded image under 'image'")
                    images.append(part["image"])
                    parts.append({"type": "image"})
                elif kind == "text":
                    parts.append({"type": "text", "text": part.get("text") or ""})
                else:
                    raise ValueError(f"unknown content part type {kind!r} (expected 'text' or 'image')")
        out.append({**m, "content": parts})
    return out, images


def expand_markers(text: str, family: ImageFamily, expansions: list[str]) -> str:
    """The rendered prompt with its i-th image marker replaced by expansions[i]; ValueError when the
    template emitted another number of markers than there are images."""
    pieces = text.split(family.marker)
    if len(pieces) - 1 != len(expansions):
        raise ValueError(f"the chat template emitted {len(pieces) - 1} image markers ({family.marker!r}) for "
                         f"{len(expansions)} images")
    out = pieces[0]
    for expansion, piece in zip(expansions, pieces[1:]):
        out += expansion + piece
    return out


def fill_image_tokens(ids: list[int], image_token_id: int, runs: Iterable[list[int]]) -> list[int]:
    """ids with its image tokens replaced, in order, by the ids of each run (one run per image: the
    image's placeholder ids, as many as it has image tokens)."""
    out = list(ids)
    positions = [i for i, t in enumerate(ids) if t == image_token_id]
    flat = [t for run in runs for t in run]
    if len(positions) != len(flat):
        raise ValueError(f"the prompt holds {len(positions)} image tokens but the images' features have "
                         f"{len(flat)} vectors")
    for i, t in zip(positions, flat):
        out[i] = t
    return out


def grid(layouts: list[Any]) -> tuple[int, int]:
    """(rows, cols) of an image's tiles from its vision encoder's layout entries: an entry with rows/cols
    (attributes or keys) gives them; entries with row/col per tile give the largest; else (0, 0)."""
    def get(obj: Any, key: str) -> Any:
        return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)

    rows = cols = 0
    for layout in layouts:
        if layout is None:
            continue
        if get(layout, "rows") is not None:
            return int(get(layout, "rows") or 0), int(get(layout, "cols") or 0)
        if get(layout, "row") is not None:
            rows, cols = max(rows, int(get(layout, "row"))), max(cols, int(get(layout, "col")))
    return rows, cols
