"""The LoRA adapters one generator serves: loaded once, picked per job, dropped after their last job.

vLLM's per-request LoRA, in process: `load_lora` registers an adapter under its name; a job names its
adapters and scales (`DynamicJob(loras=[(adapter, scale), ...])`) or, naming none, gets the default set
(`set_loras`, exllamav2's meaning: swapped only while idle). A job's set is fixed when it is enqueued and
roots its pages' hashes, so K/V is shared exactly between jobs whose sets have the same content and
scales. Each step stacks the adapters its rows use (one LoRAStack per combination, a few kept) and hands
the forward a LoRABatch. Unloading an adapter that queued or running jobs use lets them finish, as vLLM
lets in-flight requests finish, refuses new jobs naming it, and drops it when the last one ends.
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable

from ..cache.pagetable import root_hash
from ..contract.adapters import check_lora_pairs
from ..model.lora import LoRA, LoRAStack, adapter_identity, adapter_list, check_fits, combine, scale_list
from ..model.lora.batch import LoRABatch

Pairs = tuple[tuple[LoRA, float], ...]  # a job's adapters and scales, as resolved by a generator


class AdapterUnavailable(ValueError):
    """A job names an adapter this generator does not serve (never loaded, or being unloaded). Raised when
    the job is made and again when it is queued, since an unload may land in between; a server answers it
    as an unknown model (404), never as an engine failure."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name


def lora_request(loras: Any) -> tuple[tuple[LoRA | str, float], ...] | None:
    """Check DynamicJob's loras= argument: None (the generator's default set) or a list whose items are
    (adapter, scale) pairs or bare adapters (scale 1), an adapter being a loaded LoRA or its name; names and
    scales follow engine.contract's check_lora_pairs. [] asks for the base model even when a default set is
    active."""
    if loras is None:
        return None
    if not isinstance(loras, (list, tuple)):
        raise TypeError(f"loras must be a list of (adapter, scale) pairs or None, not {type(loras).__name__}")
    items = [item if isinstance(item, (tuple, list)) and len(item) == 2 else (item, 1.0) for item in loras]
    for adapter, _ in items:
        if not isinstance(adapter, (LoRA, str)) or adapter == "":
            raise TypeError(f"a job's adapter is a LoRA from load_lora() or a loaded adapter's name, got {adapter!r}")
    pairs = check_lora_pairs((adapter if isinstance(adapter, str) else adapter.name, scale) for adapter, scale in items)
    return tuple((adapter, scale) for (adapter, _), (_, scale) in zip(items, pairs))


class Adapters:
    """A generator's loaded adapters, its default set, the stacks steps use, and labels for the page map."""

    def __init__(self, model, max_stacks: int = 4):
        self.model = model
        self.loaded: dict[str, LoRA] = {}
        self.unloading: set[str] = set()
        self.default: Pairs = ()
        self.default_root = root_hash(None)
        self._stacks: OrderedDict[tuple[int, ...], LoRAStack] = OrderedDict()
        self.max_stacks = max_stacks
        self.root_ids: dict[bytes, int] = {self.default_root: 0}  # page roots -> ids the metrics report
        self.root_labels: dict[int, list[tuple[str, float]]] = {0: []}

    # ---- loading ------------------------------------------------------------------------------------
    def load(self, lora: LoRA | str | Path, name: str | None = None) -> LoRA:
        """Register an adapter (a LoRA or a PEFT folder) under its name; loading the same content under the
        same name again returns the loaded one."""
        obj = self._object(lora, name)
        self._check_names([obj])
        return self.loaded.setdefault(obj.name, obj)

    def _object(self, lora: LoRA | str | Path, name: str | None) -> LoRA:
        if isinstance(lora, str) and name is None and lora in self.loaded:
            return self.loaded[lora]  # a loaded adapter's name (set_loras takes names like jobs do)
        if isinstance(lora, LoRA):
            if name is not None and name != lora.name:
                from dataclasses import replace

                lora = replace(lora, name=name)  # shares the tensors
            return lora
        if isinstance(lora, (str, Path)):
            return LoRA.load(lora, self.model, name=name)
        raise TypeError(f"load_lora takes a LoRA or a PEFT adapter folder, not {type(lora).__name__}")

    def _check_names(self, objs: list[LoRA]) -> None:
        for obj in objs:
            check_fits(self.model, obj)
            if not obj.name:
                raise ValueError("a LoRA adapter needs a non-empty name")
            if obj.name in self.unloading:
                raise ValueError(f"LoRA adapter {obj.name!r} is being unloaded (its last jobs are running); "
                                 f"load it again once that is done")
            have = self.loaded.get(obj.name)
            if have is not None and have.content_hash != obj.content_hash:
                raise ValueError(f"another LoRA adapter named {obj.name!r} (different weights) is loaded; "
                                 f"unload it first or load this one under another name")

    def unload(self, lora: LoRA | str, users: set[int]) -> bool:
        """Drop an adapter now (True) or, while jobs in `users` (ids of adapters in use) need it, once they end
        (False); new jobs naming it are refused from now on."""
        name = self.name_of(lora)
        if any(l is self.loaded[name] for l, _ in self.default):
            raise ValueError(f"LoRA adapter {name!r} is in the default set (set_loras); change the default first")
        self.unloading.add(name)
        self.collect(users)
        return name not in self.loaded

    def collect(self, users: set[int]) -> list[str]:
        """Drop unloading adapters no job uses any more; returns their names."""
        done = [n for n in self.unloading if id(self.loaded[n]) not in users]
        for name in done:
            lora = self.loaded.pop(name)
            self.unloading.discard(name)
            for key in [k for k in self._stacks if id(lora) in k]:
                del self._stacks[key]
        return done

    def name_of(self, lora: LoRA | str) -> str:
        name = lora if isinstance(lora, str) else getattr(lora, "name", None)
        if not isinstance(name, str) or name not in self.loaded or (
                isinstance(lora, LoRA) and self.loaded[name].content_hash != lora.content_hash):
            raise ValueError(f"LoRA adapter {name!r} is not loaded into this generator")
        return name

    # ---- the default set ----------------------------------------------------------------------------
    def set_default(self, loras: Any, scales: Any = None) -> None:
        """The set jobs naming none get: LoRAs, loaded adapters' names, or folders (loaded and registered
        here). Everything is checked before anything changes."""
        items = adapter_list(loras)
        if not items and scales is not None and not (isinstance(scales, (list, tuple)) and not scales):
            raise ValueError("scales were given but no LoRA adapters")
        values = scale_list(scales, len(items)) if items else []
        objs = [self._object(item, None) for item in items]
        self._check_names(objs)
        registered = [self.loaded.setdefault(obj.name, obj) for obj in objs]
        self.default = tuple(zip(registered, values))
        self.default_root = self._root(self.default)

    # ---- jobs ---------------------------------------------------------------------------------------
    def resolve(self, request: tuple | None) -> tuple[Pairs, bytes]:
        """A job's adapters (None: the default set) and the root hash its pages chain from (registered for
        the page map's labels: call from the generator's thread)."""
        if request is None:
            return self.default, self.default_root
        pairs = self.check(request)
        return pairs, self._root(pairs)

    def check(self, request: tuple | None) -> Pairs:
        """The adapters a job would run, or a ValueError naming the one it can't (AdapterUnavailable for one
        not served); changes nothing, so any thread may call it."""
        if request is None:
            return self.default
        pairs = []
        for adapter, scale in request:
            name = adapter if isinstance(adapter, str) else adapter.name
            if name not in self.loaded:
                raise AdapterUnavailable(name, f"LoRA adapter {name!r} is not loaded into this generator "
                                 f"(load it with load_lora first; loaded: {sorted(self.loaded) or 'none'})")
            lora = self.loaded[name]
            if isinstance(adapter, LoRA) and adapter.content_hash != lora.content_hash:
                raise ValueError(f"the LoRA adapter named {name!r} in this generator has other weights than "
                                 f"the one given")
            if name in self.unloading:
                raise AdapterUnavailable(name, f"LoRA adapter {name!r} is being unloaded; it takes no new jobs")
            pairs.append((lora, scale))
        return tuple(pairs)

    def _root(self, pairs: Iterable[tuple[LoRA, float]]) -> bytes:
        pairs = list(pairs)
        root = root_hash(adapter_identity(pairs))
        if root not in self.root_ids:
            self.root_labels[len(self.root_ids)] = [(lora.name, scale) for lora, scale in pairs]
            self.root_ids[root] = len(self.root_ids)
        return root

    def step(self, rows: list[tuple[int, Pairs]]) -> LoRABatch | None:
        """The forward's LoRAApply for a step whose consecutive row groups run these adapter sets."""
        if not any(pairs for _, pairs in rows):
            return None
        distinct = {id(lora): lora for _, pairs in rows for lora, _ in pairs}
        adapters = [lora for lora, _ in combine((lora, 1.0) for lora in distinct.values())]
        key = tuple(id(lora) for lora in adapters)
        stack = self._stacks.get(key)
        if stack is None:
            stack = LoRAStack(self.model, adapters)
            self._stacks[key] = stack
            while len(self._stacks) > self.max_stacks:
                self._stacks.popitem(last=False)
        self._stacks.move_to_end(key)
        return LoRABatch(stack, [(n, dict(pairs)) for n, pairs in rows])

