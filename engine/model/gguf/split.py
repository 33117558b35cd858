"""Split GGUF sets (llama.cpp's gguf-split): NAME-00001-of-0000N.gguf, ..., read as one model.

llama.cpp loads a split model from its first file: that file's `split.count` says how many files there are,
their names follow from the first one's (llama_split_path: "%s-%05d-of-%05d.gguf"), each file's
`split.no` says which part it is, and the first file's `split.tensors.count` how many tensors the set
holds. Metadata is the first file's; the tensors are spread over all of them. The same rules apply here,
and a set that breaks them (a later part opened on its own, a missing or foreign part, a tensor count
that does not add up) is refused with the file and the problem named.
"""
from __future__ import annotations

import re
from pathlib import Path

SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_count(meta: dict) -> int:
    """How many files the model is split across (1: not split)."""
    try:
        return max(1, int(meta.get("split.count", 1) or 1))
    except (TypeError, ValueError):
        return 1


def part_path(first: Path, index: int, count: int) -> Path:
    """The name of part `index` (0-based) of the set `first` opens, by llama.cpp's naming."""
    m = SPLIT_NAME.match(first.name)
    prefix = m.group("prefix") if m else first.name.removesuffix(".gguf")
    return first.with_name(f"{prefix}-{index + 1:05d}-of-{count:05d}.gguf")


def part_paths(first: Path, meta: dict) -> list[Path]:
    """The other files of the set whose first file is `first` (metadata `meta`); [] when it is not split.
    ValueError when `first` is a later part, or a part is missing."""
    count = split_count(meta)
    if count == 1:
        return []
    no = int(meta.get("split.no", 0) or 0)
    if no != 0:
        raise ValueError(f"{first.name} is part {no + 1} of a model split across {count} files; open its first "
                         f"file, {part_path(first, 0, count).name}")
    if not SPLIT_NAME.match(first.name):
        raise ValueError(f"{first.name} is the first of {count} split files, but its name does not follow "
                         "llama.cpp's NAME-00001-of-0000N.gguf pattern, so its other parts cannot be found")
    parts = [part_path(first, i, count) for i in range(1, count)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise ValueError(f"{first.name} is split across {count} files and {len(missing)} of them are missing: "
                         f"{', '.join(missing[:4])}{' …' if len(missing) > 4 else ''}")
    return parts


def join_parts(gf) -> None:
    """Add the tensors of the other parts of the set whose first file `gf` (a GGUFFile) opened to its
    tensor table; each part stays memory-mapped in gf._maps under its tensors' names."""
    parts = part_paths(gf.path, gf.metadata)
    for index, part_file in enumerate(parts, start=1):
        part = type(gf)(part_file, header_only=True, _part=True)
        check_part(part_file, index, len(parts) + 1, part.metadata)
        for t in part.tensors:
            if t.name in gf._by_name:
                raise ValueError(f"{part_file.name} repeats tensor {t.name} of its split set")
            gf.tensors.append(t)
            gf._by_name[t.name] = t
            gf._maps[t.name] = part._map
        gf.parts.append(part_file)
    if parts:
        check_tensor_count(gf.path, gf.metadata, len(gf.tensors))


def check_part(part: Path, index: int, count: int, meta: dict) -> None:
    """A part's own metadata must place it where its name does, in a set of the same size."""
    no = meta.get("split.no")
    if no != index or split_count(meta) != count:
        said = f"part {no + 1} of {split_count(meta)}" if isinstance(no, int) else "no split part at all"
        raise ValueError(f"{part.name} does not fit its split set: its name makes it part {index + 1} of {count}, "
                         f"its metadata says {said}")


def check_tensor_count(first: Path, meta: dict, found: int) -> None:
    expected = meta.get("split.tensors.count")
    if isinstance(expected, int) and expected != found:
        raise ValueError(f"{first.name}: its split set should hold {expected} tensors, its files hold {found}")
