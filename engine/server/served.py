"""ServedModel: what the server serves right now: one generator, its tokenizer and a name.

The app hands the server its own generator (and a new ServedModel after each model load), so API
requests batch with the chats; `python -m engine serve` builds one. The model ids a client may name are
the base model's and one per adapter loaded into the generator (vLLM's convention: an adapter's id is its
name, `parent` is the base model). The generator's registry (`load_lora`/`unload_lora`) is the one owner
of which adapters exist: what the app's LoRA panel loads is served, and what the server loads the app
sees. A request for an adapter becomes a job with `loras=[(name, 1.0)]` and batches with every other
request and chat, whatever their adapters.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError


@dataclass
class ServedModel:
    generator: Any  # engine.DynamicGeneratorAsync
    tokenizer: Any  # engine.tokenizer.Tokenizer
    name: str
    created: int = field(default_factory=lambda: int(time.time()))
    can_see_images: bool = False  # a vision model: chat requests may hold image_url parts
    vision: Any = None  # engine.vision.VisionEncoder of the model (engine.vision.load_vision), or None

    def __post_init__(self) -> None:
        if self.vision is not None:
            self.can_see_images = True

    def encode_chat(self, messages: list[dict], plan: Any) -> tuple[Any, Any]:
        """(prompt ids, image embeddings) of chat messages holding {"type": "image", "image": PIL image}
        parts; only a model that can see images has it (server/image_requests refuses images otherwise).
        The model's own template renders them as the text path does (tools, chat_template_kwargs,
        tool-call history made renderable), then engine.image_prompt expands and fills the images."""
        if self.vision is None:
            raise ApiError(400, f"this model cannot see images: {self.name} reads text only", "messages",
                           "model_cannot_see_images")
        from ..chat import render_kwargs, split_images, starts_in_reasoning, template_messages, tool_call_format
        from ..generator.image_prompt import image_prompt

        template = self.tokenizer.chat_template
        fmt = (plan.tool_format if plan is not None else None) or tool_call_format(template)
        tools = plan.tools if plan is not None else None
        prepared = template_messages(messages, template, fmt, tools)
        kwargs = render_kwargs(tools, template, **(plan.template_kwargs if plan is not None else {}))
        try:
            if plan is not None and plan.markers is not None:
                text = self.tokenizer.apply_chat_template(split_images(prepared)[0], add_generation_prompt=True,
                                                          **kwargs)
                plan.in_reasoning = starts_in_reasoning(text, plan.markers)
            return image_prompt(prepared, self.tokenizer, self.vision, **kwargs)
        except ApiError:
            raise
        except Exception as exc:  # noqa: BLE001 - jinja2 raise_exception(), an image the encoder refuses, ...
            raise ApiError(400, f"the model's chat template or vision encoder rejected the messages: {exc}",
                           "messages") from None

    @property
    def max_seq_len(self) -> int:
        return self.generator.max_seq_len

    @property
    def adapters(self) -> dict[str, str | None]:
        """name -> folder of every adapter a request may name (loaded and not being unloaded)."""
        return self.generator.adapters().available

    def resolve(self, model: Any) -> str | None:
        """The adapter a request's `model` names (None: the base model); 404 for an unknown id."""
        if model is None or model == self.name:
            return None
        if not isinstance(model, str):
            raise ApiError(400, f"model must be a string, got {type(model).__name__}", "model")
        adapters = self.adapters
        if model in adapters:
            return model
        raise ApiError(404, f"The model `{model}` does not exist. Available: "
                            f"{', '.join([self.name, *adapters])}", "model", "model_not_found")

    @staticmethod
    def job_loras(adapter: str | None) -> list[tuple[str, float]]:
        """The job's loras= for a request: the named adapter at scale 1, or [] (the base model, never the
        app's default set: an API client that names the base model gets the base model)."""
        return [] if adapter is None else [(adapter, 1.0)]

    def model_entries(self) -> list[dict]:
        """/v1/models data: the base model, then each adapter with its base as parent (as vLLM lists them)."""
        base = {"id": self.name, "object": "model", "created": self.created, "owned_by": "pagedeck",
                "root": self.name, "parent": None, "max_model_len": self.max_seq_len}
        chat_format = getattr(self.tokenizer, "chat_format", None)
        if chat_format is not None:  # which prompt format chat requests are rendered with (engine.model.chat_format)
            base["prompt_format"] = chat_format.label
        out = [base]
        for name, folder in self.adapters.items():
            out.append({"id": name, "object": "model", "created": self.created, "owned_by": "pagedeck",
                        "root": folder or name, "parent": self.name, "max_model_len": self.max_seq_len})
        return out
