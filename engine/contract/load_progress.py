"""LoadProgress: one report of a model load's progress, as plain data (no torch), for the app's Model tab.

A load has three stages: "header" (the checkpoint's metadata and tensor table), "weights" (reading and packing
the tensors; `fraction` is the share of the file's tensor bytes done) and "tokenizer" (built on its own thread
beside the weights). Each stage reports once when it starts, the weights as they advance, and once when it
ends (`done`, or `error` when it failed), with the seconds it has taken so far.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

LoadStageName = Literal["header", "weights", "tokenizer"]
LOAD_STAGES: tuple[LoadStageName, ...] = ("header", "weights", "tokenizer")


@dataclass(frozen=True)
class LoadProgress:
    stage: LoadStageName
    fraction: float  # 0..1 of this stage (weights: tensor bytes done / total; others 0 until done, then 1)
    elapsed_s: float  # seconds since this stage started
    done: bool = False
    error: str | None = None  # why the stage failed (the load raises it); None while it runs or once done

    def __post_init__(self) -> None:
        if self.stage not in LOAD_STAGES:
            raise ValueError(f"load stage must be one of {LOAD_STAGES}, got {self.stage!r}")
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"load progress fraction must be in [0, 1], got {self.fraction!r}")


LoadProgressCallback = Callable[[LoadProgress], None]


def stage_summary(durations: dict[str, float]) -> str:
    """The finished stages in load order with their seconds: "header 0.02 s · weights 0.61 s · tokenizer 0.35 s"."""
    return " · ".join(f"{s} {durations[s]:.2f} s" for s in LOAD_STAGES if s in durations)
