"""What an attached image costs in prompt tokens on a model that sees images, asked of its vision encoder.

The context meter asks for every image of a chat on each update, so each attached image is laid out
(engine.image_token_count: tiles, global view and their tags, without running the encoder's network) once
per encoder and remembered. Torch-free here: the engine does the work.
"""
from __future__ import annotations

from typing import Any

MAX_REMEMBERED = 256


class ImageCosts:
    def __init__(self) -> None:
        self._costs: dict[tuple, int] = {}  # (encoder identity, attached image) -> its prompt tokens

    def cost(self, image: Any, tokenizer: Any, vision: Any) -> int | None:
        """The prompt tokens of `image` (an app.core.images.AttachedImage, or a decoded PIL image) on the
        model of `tokenizer` and `vision`; None where the model has no vision encoder."""
        if vision is None or tokenizer is None:
            return None
        import engine

        if not hasattr(image, "pil"):
            return engine.image_token_count(image, tokenizer, vision)
        key = (getattr(vision, "identity", None) or id(vision), image)
        cost = self._costs.get(key)
        if cost is None:
            if len(self._costs) >= MAX_REMEMBERED:
                self._costs.clear()
            cost = self._costs[key] = engine.image_token_count(image.pil(), tokenizer, vision)
        return cost
