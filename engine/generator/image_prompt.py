"""A chat with images -> prompt ids + embeddings for DynamicJob(input_ids, embeddings=...).

The torch-free part (engine.chat.image_prompt) shapes the messages for the model's chat template and
expands each image marker the way the model's HF processor does; this part runs the vision encoder, wraps
each image's features in an MMEmbedding and puts its placeholder ids where the image tokens are.

`vision` is the encoder of the model's images: engine.vision.VisionEncoder, whose encode(image) returns
ImageTokens (before + placeholder * n + after, and the n embeddings; the processor's text), its kind
("idefics3" | "gemma3") and content_hash(image). Any object with encode(image) -> [(layout, features),
...] works too: features (n, hidden) in the language model's embedding space in prompt order (Idefics3:
the tiles row by row, then the global view; Gemma 3: one pair), a layout carrying rows/cols of the tile
grid (a dict or attributes; or row/col per tile; None: not split), and vision.identity (a str: the
encoder's weights and settings) in each image's content hash. Equal content hashes give equal placeholder
ids, hence shared prompt cache pages across chats.
"""
from __future__ import annotations

import hashlib
import threading
import uuid
from collections import OrderedDict
from typing import Any, Protocol

import torch

from ..chat.image_prompt import ImageFamily, expand_markers, fill_image_tokens, grid, image_family, split_images
from .embeddings import MMEmbedding


class VisionEncoder(Protocol):
    def encode(self, image: Any) -> list: ...  # ImageTokens, or (layout, features) pairs


def image_hash(image: Any, identity: str) -> bytes:
    """Content hash of a decoded image (a PIL image: its mode, size and pixels; else its bytes) under an encoder."""
    h = hashlib.blake2b(identity.encode(), digest_size=16)
    if hasattr(image, "tobytes") and hasattr(image, "size"):
        h.update(f"{getattr(image, 'mode', '')}:{image.size}".encode())
        h.update(image.tobytes())
    elif isinstance(image, (bytes, bytearray)):
        h.update(bytes(image))
    else:
        raise TypeError(f"cannot hash an image of type {type(image).__name__} (pass a PIL image)")
    return h.digest()


def encoder_identity(vision: Any) -> str | None:
    """The encoder's identity for content hashes: vision.identity; else a random one given to this object
    for its life (an address could be reused by another encoder); None where it can't be given one
    (its images then share nothing)."""
    identity = getattr(vision, "identity", None) or getattr(vision, "_pagedeck_identity", None)
    if identity:
        return str(identity)
    try:
        vision._pagedeck_identity = uuid.uuid4().hex
    except (AttributeError, TypeError):
        return None
    return vision._pagedeck_identity


class EncodedImages:
    """The last `capacity` images' MMEmbeddings and expansions by content hash: a chat re-renders its whole
    history every turn, and its images must not go through the vision encoder every time."""

    def __init__(self, capacity: int = 32):
        self.capacity = capacity
        self._items: OrderedDict[tuple[bytes, str], tuple[MMEmbedding, str]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[bytes, str]) -> tuple[MMEmbedding, str] | None:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def put(self, key: tuple[bytes, str], item: tuple[MMEmbedding, str]) -> None:
        with self._lock:
            self._items[key] = item
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)


ENCODED = EncodedImages()


def content_key(image: Any, vision: Any) -> bytes | None:
    """The image's content hash under this encoder: vision.content_hash(image) where it has one
    (engine.vision's: sha256 of the RGB pixels and the encoder's identity), else image_hash with the
    encoder's identity; None when the encoder can't be told apart from others."""
    own = getattr(vision, "content_hash", None)
    if callable(own):
        value = own(image)
        return value if isinstance(value, bytes) else str(value).encode()
    identity = encoder_identity(vision)
    return image_hash(image, identity) if identity is not None else None


def features_and_text(parts: list, family: ImageFamily) -> tuple[torch.Tensor, str]:
    """An image's features (n, hidden) and the text its marker expands to, from vision.encode's parts:
    engine.vision's ImageTokens (before + placeholder * n + after, embeddings; their text is the
    processor's), or (layout, features) pairs (the family's expansion of the layout's tile grid)."""
    if hasattr(parts[0], "embeddings") and hasattr(parts[0], "placeholder"):
        wrong = {p.placeholder for p in parts} - {family.image_token}
        if wrong:
            raise ValueError(f"the vision encoder's placeholder {wrong.pop()!r} is not the {family.name} image token "
                             f"{family.image_token!r}")
        features = torch.cat([p.embeddings.reshape(-1, p.embeddings.shape[-1]) for p in parts])
        return features, "".join(p.before + p.placeholder * int(p.embeddings.shape[0]) + p.after for p in parts)
    features = torch.cat([t.reshape(-1, t.shape[-1]) for _, t in parts])
    rows, cols = grid([layout for layout, _ in parts])
    tiles = family.tiles(rows, cols)
    if features.shape[0] % tiles:
        raise ValueError(f"{features.shape[0]} image features do not split into {tiles} tiles")
    return features, family.expand(features.shape[0] // tiles, rows, cols)


def image_embedding(image: Any, vision: VisionEncoder, family: ImageFamily,
                    cache: EncodedImages | None = ENCODED) -> tuple[MMEmbedding, str]:
    """One image's MMEmbedding and the prompt text its marker expands to (from `cache` when this image
    was encoded by this encoder lately)."""
    content = content_key(image, vision)
    cache = cache if content is not None else None
    key = (content, family.name)
    hit = cache.get(key) if cache is not None else None
    if hit is not None:
        return hit
    parts = vision.encode(image)
    if not parts:
        raise ValueError("the vision encoder returned no features for an image")
    features, text = features_and_text(list(parts), family)
    item = (MMEmbedding(features, content_hash=content), text)
    if cache is not None:
        cache.put(key, item)
    return item


def image_prompt(messages: list[dict], tokenizer: Any, vision: VisionEncoder, family: ImageFamily | str | None = None,
                 add_generation_prompt: bool = True, cache: EncodedImages | None = ENCODED,
                 **template_kwargs: Any) -> tuple[torch.Tensor, list[MMEmbedding]]:
    """((1, n) prompt ids, the images' MMEmbeddings) of OpenAI-shaped messages with image parts
    ({"type": "image", "image": <PIL image>}), rendered by the model's own chat template.

    family: the model's image family (engine.chat.image_prompt: "idefics3"/"smolvlm", "gemma3"); None
    takes the encoder's kind (vision.kind), else the tokenizer's model type (config.json). cache: recently
    encoded images (None: encode every image again)."""
    if not isinstance(family, ImageFamily):
        family = image_family(family or getattr(vision, "kind", None) or getattr(tokenizer, "arch", None))
    shaped, images = split_images(messages)
    text = tokenizer.apply_chat_template(shaped, add_generation_prompt=add_generation_prompt, **template_kwargs)
    embeddings, expansions = [], []
    for image in images:
        embedding, expansion = image_embedding(image, vision, family, cache)
        embeddings.append(embedding)
        expansions.append(expansion)
    ids = tokenizer.encode(expand_markers(text, family, expansions), encode_special_tokens=True)[0].tolist()
    image_token_id = tokenizer.token_to_id(family.image_token)
    if images and image_token_id is None:
        raise ValueError(f"the tokenizer has no {family.image_token!r} token: not a {family.name} model's tokenizer")
    ids = fill_image_tokens(ids, image_token_id if image_token_id is not None else -1,
                            [e.token_ids for e in embeddings])
    return torch.tensor([ids], dtype=torch.long), embeddings


def image_token_count(image: Any, tokenizer: Any, vision: VisionEncoder,
                      family: ImageFamily | str | None = None) -> int:
    """The prompt tokens one image costs on this model: its marker's expansion (tile tags, placeholders,
    the global view) tokenized. engine.vision's encoder lays the image out without running its network
    (cheap enough for a UI to ask on attach); another encoder encodes it (cached for the send)."""
    if not isinstance(family, ImageFamily):
        family = image_family(family or getattr(vision, "kind", None) or getattr(tokenizer, "arch", None))
    if hasattr(vision, "preprocess") and hasattr(vision, "tokens_per_tile"):
        _, segments = vision.preprocess(image)
        text = "".join(before + vision.placeholder * vision.tokens_per_tile + after for before, after in segments)
    else:
        text = image_embedding(image, vision, family)[1]
    return int(tokenizer.encode(text, encode_special_tokens=True).shape[-1])
