"""Damaged copies of a GGUF file, for checking that loading one never takes the process down.

Each corruption is one way a download or a disk goes wrong, or a hostile file is made: cut short,
bits flipped, or one field of the header (a count, a length, a type, a value) set to a wrong number.
The same seed always gives the same files.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gguf import GGUFReader, GGUFValueType

_HUGE = (2**64 - 1, 2**63, 2**32, 10**12)
_SCALAR_FORMATS = {GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f",
                   GGUFValueType.BOOL: "<B"}
_SCALAR_VALUES = {"<I": (0, 1, 7, 2**31, 2**32 - 1), "<i": (-1, 0, 2**31 - 1, -2**31),
                  "<f": (0.0, -1.0, float("nan"), float("inf"), 1e30), "<B": (0, 1, 2, 255)}
# The values that made llama.cpp abort (GGML_ASSERT) before check_gguf refused them.
KNOWN_CRASHES = (("llama.block_count", "<I", 0), ("llama.block_count", "<I", 2**32 - 1),
                 ("llama.attention.layer_norm_rms_epsilon", "<f", -1.0),
                 ("llama.attention.layer_norm_rms_epsilon", "<f", float("nan")))


@dataclass(frozen=True)
class _Layout:
    data: bytes
    data_offset: int
    lengths: list[tuple[str, int]]  # where each key's (and string value's) length is
    value_types: list[tuple[str, int]]
    arrays: list[tuple[str, int]]  # where each array's element type is (its count follows)
    scalars: dict[str, tuple[int, str]]
    tensors: list[tuple[str, int, int]]  # name, where its n_dims is, where its type is


def _layout(path: Path) -> _Layout:
    reader = GGUFReader(path)
    lengths, value_types, arrays, scalars, tensors = [], [], [], {}, []
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        sizes = [part.nbytes for part in field.parts]
        value_at = field.offset + sum(sizes[:3])
        lengths.append((name, field.offset))
        value_types.append((name, field.offset + sum(sizes[:2])))
        if field.types[0] == GGUFValueType.STRING:
            lengths.append((f"{name} (value)", value_at))
        elif field.types[0] == GGUFValueType.ARRAY:
            arrays.append((name, value_at))
        elif field.types[0] in _SCALAR_FORMATS:
            scalars[name] = (value_at, _SCALAR_FORMATS[field.types[0]])
    for tensor in reader.tensors:
        sizes = [part.nbytes for part in tensor.field.parts]
        dims_at = tensor.field.offset + sizes[0] + sizes[1]
        tensors.append((tensor.name, dims_at, dims_at + 4 + sizes[3]))
    return _Layout(path.read_bytes(), reader.data_offset, lengths, value_types, arrays, scalars, tensors)


def _put(data: bytes, offset: int, fmt: str, value: float) -> bytes:
    copy = bytearray(data)
    struct.pack_into(fmt, copy, offset, value)
    return bytes(copy)


def corruptions(path: Path, seed: int, count: int) -> list[tuple[str, bytes]]:
    """`count` damaged copies of the GGUF at `path` as (what was done, bytes), the known crashes first."""
    layout = _layout(path)
    data, rng = layout.data, random.Random(seed)

    def truncated() -> tuple[str, bytes]:
        cut = rng.randrange(0, layout.data_offset if rng.random() < 0.7 else len(data))
        return f"cut at byte {cut}", data[:cut]

    def flipped() -> tuple[str, bytes]:
        copy, flips = bytearray(data), rng.randint(1, 16)
        for _ in range(flips):
            copy[rng.randrange(layout.data_offset)] ^= 1 << rng.randrange(8)
        return f"{flips} bits flipped in the header", bytes(copy)

    def header_count() -> tuple[str, bytes]:
        name, offset = rng.choice((("tensor count", 8), ("key/value count", 16)))
        value = rng.choice((0, 1, rng.randrange(2, 100), *_HUGE))
        return f"{name} = {value}", _put(data, offset, "<Q", value)

    def length() -> tuple[str, bytes]:
        name, offset = rng.choice(layout.lengths)
        value = rng.choice((0, rng.randrange(1, 4096), len(data), *_HUGE))
        return f"length of {name} = {value}", _put(data, offset, "<Q", value)

    def value_type() -> tuple[str, bytes]:
        name, offset = rng.choice(layout.value_types)
        value = rng.choice((13, 255, 2**32 - 1, rng.randrange(13)))
        return f"value type of {name} = {value}", _put(data, offset, "<I", value)

    def array() -> tuple[str, bytes]:
        name, offset = rng.choice(layout.arrays)
        if rng.random() < 0.5:
            value = rng.choice((9, 13, 2**32 - 1, rng.randrange(13)))
            return f"element type of {name} = {value}", _put(data, offset, "<I", value)
        value = rng.choice((0, 1, rng.randrange(2, 1000), *_HUGE))
        return f"element count of {name} = {value}", _put(data, offset + 4, "<Q", value)

    def scalar() -> tuple[str, bytes]:
        name = rng.choice(sorted(layout.scalars))
        offset, fmt = layout.scalars[name]
        value = rng.choice(_SCALAR_VALUES[fmt])
        return f"{name} = {value}", _put(data, offset, fmt, value)

    def tensor() -> tuple[str, bytes]:
        name, dims_at, type_at = rng.choice(layout.tensors)
        field, offset, fmt, value = rng.choice((
            ("n_dims", dims_at, "<I", rng.choice((0, 5, 2**32 - 1))),
            ("first dimension", dims_at + 4, "<Q", rng.choice((0, 2**40, 2**64 - 1))),
            ("type", type_at, "<I", rng.choice((4, 40, 2**32 - 1))),
            ("data offset", type_at + 4, "<Q", rng.choice((1, len(data), 2**64 - 1))),
        ))
        return f"{field} of {name} = {value}", _put(data, offset, fmt, value)

    def garbage() -> tuple[str, bytes]:
        size = rng.randrange(4096)
        return f"{size} random bytes after a GGUF v3 magic", data[:8] + rng.randbytes(size)

    kinds: list[Callable[[], tuple[str, bytes]]] = [
        truncated, flipped, header_count, length, value_type, array, scalar, tensor, garbage]
    known = [(f"{name} = {value}", _put(data, layout.scalars[name][0], fmt, value))
             for name, fmt, value in KNOWN_CRASHES]
    return (known + [kinds[i % len(kinds)]() for i in range(count)])[:count]


def duplicate_token(path: Path) -> bytes:
    """The model with byte token <0x01> renamed <0x00>: a vocabulary listing a token twice made llama.cpp
    abort while building it."""
    data = path.read_bytes()
    entry = struct.pack("<Q", 6) + b"<0x01>"
    at = data.index(entry)
    return data[:at] + struct.pack("<Q", 6) + b"<0x00>" + data[at + len(entry):]
