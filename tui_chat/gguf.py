"""A GGUF file's metadata, read with every count and length checked against the file's size.

llama.cpp refuses most damaged models with an error, but a few values make it abort the whole process
(a GGML_ASSERT) at load or at the first reply. `check_metadata` refuses those before llama.cpp sees them;
they were found by fuzzing (tests/test_gguf_fuzz.py).

A leaf: the standard library only, so the hub (importing a model) and the engine (loading one) both check
files here without either importing the other.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 counted in 32 bits; llama.cpp no longer reads it
MAX_LAYERS = 512  # LLAMA_MAX_LAYERS
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")
_VOCABULARY = "tokenizer.ggml.tokens"
_HEADER_BYTES = 24  # magic, version, tensor count, key/value count
_MIN_ENTRY_BYTES = 13  # a key/value entry: key length, value type, a one-byte value
_MIN_TENSOR_BYTES = 24  # a tensor's entry: name length, dimension count, type, offset


# `general.file_type`: how most of the weights are quantised (llama.cpp's llama_ftype)
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE",
}


class GgufProblem(ValueError):
    """Why a file cannot be loaded; the message reads after the file's name."""


class UnusableModel(ValueError):
    """A file that is not a model llama.cpp can load, in one line that names it (`check_model_file`)."""


@dataclass(frozen=True, slots=True)
class GgufHeader:
    """What loading a model needs from its file besides the weights, read in one pass (`read_header`)."""

    tensor_types: frozenset[int]  # the ggml types of its tensors (12 for Q4_K): which CPU kernels they will meet
    sha256: str  # of every byte before the tensor data (settings, vocabulary, tensor list): tells two versions
    #              of a model apart without reading the weights


def read_metadata(path: Path, keep_vocabulary: bool = True) -> dict[str, Any]:
    """The key/value metadata. Arrays are checked and skipped, except the vocabulary (a list of bytes).

    Raises GgufProblem for a file that is not GGUF or whose header does not fit inside it, and the
    usual OSErrors for a file that cannot be read.
    """
    with _mapped(path) as data:
        return _Reader(data, keep_vocabulary).metadata()


def read_header(path: Path) -> GgufHeader:
    """The metadata, the tensor list and their hash, in one pass over the header for everything a load asks of
    the file; the metadata is checked (`check_metadata`) once the file is unmapped, so that the check's set of
    the vocabulary does not need room beside the mapping. Raises as `read_metadata` does."""
    with _mapped(path) as data:
        reader = _Reader(data)
        metadata = reader.metadata()
        tensor_count = struct.unpack_from("<Q", data, 8)[0]
        types = frozenset(reader.tensor_type() for _ in range(tensor_count))
        with memoryview(data)[: reader.pos] as header:  # hashed where it lies: no copy of its megabytes
            sha256 = hashlib.sha256(header).hexdigest()
    check_metadata(metadata)
    return GgufHeader(types, sha256)


def check_model_file(path: Path) -> GgufHeader:
    """Reject what is not a GGUF model, or is damaged in a way that would make llama.cpp abort, before
    llama.cpp sees it; what a load needs from the header comes with the answer. A file is read once per
    size and modification time (a vocabulary takes ~0.1 s): a load asks each time, and reads it once."""
    try:
        stat = path.stat()
        return _cached_header(path, stat.st_size, stat.st_mtime_ns)
    except FileNotFoundError:
        raise UnusableModel(f"model file not found: {path}") from None
    except IsADirectoryError:
        raise UnusableModel(f"{path} is a directory, not a .gguf model file") from None
    except OSError as error:
        if error.errno == errno.ENOMEM:  # the file is mapped to be read: no room for it is no room for the model
            raise UnusableModel(f"cannot load {path.name}: not enough memory (mmap failed: {error.strerror})") from None
        raise UnusableModel(f"cannot read model file {path}: {error.strerror}") from None
    except GgufProblem as problem:
        raise UnusableModel(f"{path} {problem}") from None


@functools.lru_cache(maxsize=16)
def _cached_header(path: Path, _size: int, _mtime_ns: int) -> GgufHeader:
    return read_header(path)


def _mapped(path: Path) -> mmap.mmap:
    """The file mapped for reading, once its first bytes say it is a GGUF this llama.cpp reads."""
    with path.open("rb") as handle:
        head = handle.read(_HEADER_BYTES)
        if len(head) < 8 or head[:4] != MAGIC:
            raise GgufProblem("is not a GGUF model file")
        (version,) = struct.unpack_from("<I", head, 4)
        if version not in VERSIONS:
            raise GgufProblem(f"is GGUF version {version}, which this llama.cpp cannot read")
        if len(head) < _HEADER_BYTES:
            raise GgufProblem("is damaged: it ends inside its header (an incomplete download?)")
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


def quantization(path: Path) -> str:
    """The file type its metadata names (`Q4_K_M`), or "" when it names none or cannot be read."""
    try:
        file_type = read_metadata(path, keep_vocabulary=False).get("general.file_type")
        return FILE_TYPES.get(file_type, "") if isinstance(file_type, int) else ""
    except (OSError, GgufProblem):
        return ""


def check_metadata(metadata: dict[str, Any]) -> None:
    """Refuse the values known to make llama.cpp abort instead of failing cleanly."""
    arch = metadata.get("general.architecture")
    prefix = arch.decode("utf-8", "replace") if isinstance(arch, bytes) else ""
    layers = metadata.get(f"{prefix}.block_count")
    if isinstance(layers, int) and not 1 <= layers <= MAX_LAYERS:
        raise GgufProblem(f"is damaged: {prefix}.block_count is {layers} (a model has 1 to {MAX_LAYERS} layers)")
    for key in (f"{prefix}.attention.layer_norm_rms_epsilon", f"{prefix}.attention.layer_norm_epsilon"):
        epsilon = metadata.get(key)
        if isinstance(epsilon, float) and not (math.isfinite(epsilon) and epsilon >= 0):
            raise GgufProblem(f"is damaged: {key} is {epsilon} (it must be a small positive number)")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and len(set(tokens)) != len(tokens):
        raise GgufProblem("is damaged: its vocabulary (tokenizer.ggml.tokens) lists a token twice")


class _Reader:
    def __init__(self, data: mmap.mmap, keep_vocabulary: bool = True) -> None:
        self.data = data
        self.pos = 8
        self.keep_vocabulary = keep_vocabulary

    def metadata(self) -> dict[str, Any]:
        tensor_count, entry_count = self.unpack("<Q"), self.unpack("<Q")
        room = len(self.data) - _HEADER_BYTES
        if entry_count * _MIN_ENTRY_BYTES + tensor_count * _MIN_TENSOR_BYTES > room:
            raise GgufProblem(f"is damaged: its header counts {entry_count} settings and {tensor_count} tensors, "
                              "more than the file can hold")
        metadata = {}
        for _ in range(entry_count):
            key = self.string().decode("utf-8", "replace")
            value = self.value(self.unpack("<I"), key)
            if value is not None:
                metadata[key] = value
        return metadata

    def tensor_type(self) -> int:
        """One tensor's entry (name, dimensions, type, offset); returns its type."""
        self.string()
        dimensions = self.unpack("<I")
        self.need(8 * dimensions, "a tensor's shape")
        self.pos += 8 * dimensions
        kind: int = self.unpack("<I")
        self.unpack("<Q")
        return kind

    def value(self, kind: int, key: str) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            return self.array(key)
        if kind not in _SCALARS:
            raise GgufProblem(f"is damaged: {key} has an unknown value type ({kind})")
        return self.unpack(_SCALARS[kind])

    def array(self, key: str) -> list[bytes] | None:
        kind, count = self.unpack("<I"), self.unpack("<Q")
        if kind == _STRING:
            return self.strings(count, key, keep=self.keep_vocabulary and key == _VOCABULARY)
        if kind not in _SCALARS:
            raise GgufProblem(f"is damaged: {key} is an array of an unknown type ({kind})")
        size = struct.calcsize(_SCALARS[kind]) * count
        self.need(size, key)
        self.pos += size
        return None

    def strings(self, count: int, key: str, keep: bool) -> list[bytes] | None:
        """A string array (vocabularies and merge lists have 100,000s): the checks of `string`, lookups hoisted."""
        self.need(count * 8, key)
        data, pos, end, length_at = self.data, self.pos, len(self.data), _LENGTH.unpack_from
        items = []
        for _ in range(count):
            if end - pos < 8 or (length := length_at(data, pos)[0]) > end - pos - 8:
                raise GgufProblem(f"is damaged: {key} runs past the end of the file (an incomplete download?)")
            pos += 8
            if keep:
                items.append(data[pos : pos + length])
            pos += length
        self.pos = pos
        return items if keep else None

    def string(self) -> bytes:
        length = self.unpack("<Q")
        self.need(length, "a name or text")
        text = self.data[self.pos : self.pos + length]
        self.pos += length
        return text

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size, "the metadata")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def need(self, size: int, what: str) -> None:
        if size > len(self.data) - self.pos:
            raise GgufProblem(f"is damaged: {what} runs past the end of the file (an incomplete download?)")
