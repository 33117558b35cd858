"""EngineService's LoRA adapters: loaded into the generator's registry, unloaded, the default set applied.

The generator's registry is the one list of loaded adapters (the LoRA panel's and API clients' alike);
a chat naming adapters runs with those, a chat naming none with the default set, which is swapped only
while idle (ExLlamaV2's rule: `loras_pending` tells the panel). The state (`generator`, `chat_loras`,
the signals) is EngineService's.
"""
from __future__ import annotations

from pathlib import Path


class LoraControl:
    """The LoRA panel's members of EngineService."""

    def loaded_adapters(self) -> list[str]:
        return [] if self.generator is None else list(self.generator.adapters().folders)

    adapter_names = loaded_adapters  # Backend

    def _adapter_folders(self) -> dict[str, str]:
        """name -> folder of every adapter loaded from disk (the panel's or an API client's): a reload loads
        them into the new generator."""
        if self.generator is None:
            return {}
        return {name: folder for name, folder in self.generator.adapters().folders.items() if folder}

    async def load_adapter(self, path: str | Path, failed: str | None = None, name: str | None = None) -> bool:
        """Load a PEFT folder into the generator (read off the loop) under its folder name; a reload loads
        the same folders into the new model."""
        if self.generator is None:
            self.lora_failed.emit("load a model before loading LoRA adapters")
            return False
        try:
            await self.generator.load_lora(str(path), name)
        except Exception as exc:  # noqa: BLE001 - shown in the panel, never raised into the loop
            what = failed or f"Could not load LoRA adapter {Path(path).name}"
            self.lora_failed.emit(f"{what}: {type(exc).__name__}: {exc}")
            return False
        self.loras_loaded.emit(self.loaded_adapters())
        return True

    async def unload_adapter(self, name: str) -> bool:
        """Unload an adapter; returns once its last running reply has ended (new replies can't name it)."""
        if self.generator is None:
            return False
        try:
            await self.generator.unload_lora(name)
        except Exception as exc:  # noqa: BLE001 - e.g. it is in the default set
            self.lora_failed.emit(f"Could not unload LoRA adapter {name}: {exc}")
            return False
        self.loras_loaded.emit(self.loaded_adapters())
        return True

    async def apply_loras(self, pairs: list[tuple[str, float]], failed: str = "Could not apply LoRA set") -> bool:
        """Set the default set (folders or loaded names) for chats that name none: at once when idle, else
        pending until running jobs finish (new default-set replies defer meanwhile)."""
        if self.generator is None:
            self.lora_failed.emit("load a model before applying LoRA adapters")
            return False
        wanted = [(str(p), float(s)) for p, s in pairs]
        previous, self.chat_loras = self.chat_loras, tuple(wanted)
        self.loras_pending.emit(True)
        try:
            await self.generator.set_loras([p for p, _ in wanted] or None, [s for _, s in wanted] or None)
        except Exception as exc:  # noqa: BLE001 - shown in the panel, never raised into the loop
            self.chat_loras = previous
            self.lora_failed.emit(f"{failed}: {type(exc).__name__}: {exc}")
            return False
        finally:
            self.loras_pending.emit(False)
        self.loras_active.emit([name for name, _ in self.generator.adapters().default])
        self.loras_loaded.emit(self.loaded_adapters())
        return True
