"""The GPU's regime on any CPU: a proxy of the starter with its architecture, tokenizer, chat template and whole
262,144-token vocabulary, but two blocks 32 wide and random weights.

Why: on a GPU the starter decodes a token in ~1 ms, so whatever the app does per token (a 262k-float logits row,
the sampler chain, the inspector's top N, the detokeniser, the event to the screen) is a large share of it; on 2
CPU cores the real starter takes ~20 ms a token and hides that work. The proxy keeps every piece of it and cuts
llama.cpp's own to 2-3 ms a token on a CPU (the 262k x 32 output rows dominate). The output matrix is untied from
the embedding (a tied one makes the last token's own row win every step at p = 1) and its rows scaled so the
logits are heavy-tailed as a trained model's: a top token of p ~0.1-0.6, some hundreds within 12 nats.

Deterministic (a fixed seed): the same file from the same starter. Made once per starter file and width into the
benchmarks' cache (`proxy_model()`), or by hand:

    python benchmarks/proxy.py [OUT.gguf] [--width 32]
"""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path

import numpy as np

BLOCKS = 2
WIDTH = 32
SEED = 0
HEAVY_ROWS = 256  # output rows scaled up: the likely tokens of a heavy-tailed distribution


def proxy_model(width: int = WIDTH) -> Path:
    """The proxy for this installation's starter, made on first use (~10 s) and kept in tui-chat's cache."""
    from tui_chat.config import cache_dir, models_dir
    from tui_chat.engine.models import starter_path

    starter = starter_path(models_dir())
    stamp = hashlib.sha256(f"{starter.stat().st_size}:{width}:{BLOCKS}:{SEED}".encode()).hexdigest()[:12]
    out = cache_dir() / "bench-models" / f"starter-proxy-{width}w-{stamp}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(f".{os.getpid()}.partial")
        write_proxy(starter, partial, width)
        os.replace(partial, out)
    return out


def write_proxy(real: Path, out: Path, width: int = WIDTH) -> None:
    """`real`'s metadata and tokenizer with every layer shrunk to `width` and `BLOCKS` blocks of random Q8_0."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(real)
    arch = reader.fields["general.architecture"].contents()
    shrunk, dims = _shapes(reader, arch, width)
    logit_scale = 2.0 * (int(reader.fields[f"{arch}.embedding_length"].contents()) / width) ** 0.5
    writer = GGUFWriter(out, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type",
                                                 "general.quantization_version"):
            continue
        value = shrunk.get(name.removeprefix(f"{arch}."), field.contents()) if name.startswith(f"{arch}.") \
            else field.contents()
        kind = field.types[0]
        writer.add_key_value(name, value, kind, sub_type=field.types[1] if kind == GGUFValueType.ARRAY else None)
    writer.add_file_type(7)  # MOSTLY_Q8_0
    writer.add_quantization_version(2)
    rng = np.random.default_rng(SEED)
    kept = {t.name: t for t in reader.tensors if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < BLOCKS}
    kept.setdefault("output.weight", kept["token_embd.weight"])  # Gemma ties its output to the embedding: untied
    for name, tensor in kept.items():
        _add_tensor(writer, name, tuple(reversed([dims.get(int(n), int(n)) for n in tensor.shape])), rng, logit_scale)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _shapes(reader, arch: str, width: int) -> tuple[dict[str, int], dict[int, int]]:
    """The architecture's new sizes, and every dimension of the real model mapped to the proxy's (the
    vocabulary, and what is not a layer's size, kept)."""
    def get(key: str) -> int:
        return int(reader.fields[f"{arch}.{key}"].contents())

    head_dim = max(32, width // 2)
    old_width, old_ff, old_head = get("embedding_length"), get("feed_forward_length"), get("attention.key_length")
    heads, kv_heads = get("attention.head_count"), get("attention.head_count_kv")
    shrunk = {"block_count": BLOCKS, "embedding_length": width, "feed_forward_length": 2 * width,
              "attention.key_length": head_dim, "attention.value_length": head_dim}
    dims = {old_width: width, old_ff: 2 * width, old_head: head_dim, heads * old_head: heads * head_dim,
            kv_heads * old_head: kv_heads * head_dim}
    return shrunk, dims


def _add_tensor(writer, name: str, shape: tuple[int, ...], rng: np.random.Generator, logit_scale: float) -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    if len(shape) == 1:
        writer.add_tensor(name, np.ones(shape, np.float32) if "norm" in name else
                          (rng.standard_normal(shape) * 0.02).astype(np.float32))
        return
    data = rng.standard_normal(shape, dtype=np.float32) * 0.02
    if name == "output.weight":
        data *= logit_scale  # logits ~ N(0, 1), as the real width gives
        data[rng.choice(shape[0], HEAVY_ROWS, replace=False)] *= 5.0
    packed = quantize(data, GGMLQuantizationType.Q8_0)
    writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=GGMLQuantizationType.Q8_0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, help="where to write it (default: the benchmarks' cache)")
    parser.add_argument("--width", type=int, default=WIDTH, help=f"the layers' width (default {WIDTH})")
    args = parser.parse_args()
    if args.out is None:
        print(proxy_model(args.width))
        return
    from tui_chat.config import models_dir
    from tui_chat.engine.models import starter_path

    write_proxy(starter_path(models_dir()), args.out, args.width)
    print(args.out)


if __name__ == "__main__":
    main()
