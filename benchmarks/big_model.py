"""A random-weight ~1.2B-parameter GGUF for timing only: Llama 3.2 1B's shape (2,048 wide, 16 layers, 32 query
and 8 KV heads, an 8,192 FFN, a 128,256-token vocabulary, the output tied to the embeddings) in Q8_0, ~1.3 GB.

Why: the starter's step is dominated by its 262k-token output layer, which llama.cpp computes per sequence, so
batching sequences gains little there; a model whose layers outweigh its output layer shows what the lab's
columns cost on the models people run. Its replies are noise; its speed is a real model's of that shape.

    python benchmarks/big_model.py PATH.gguf      then    python benchmarks/lab.py --model PATH.gguf
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType
from gguf.quants import quantize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from tiny_model import BOS_ID, EOS_ID, SPACE, UNK_ID, build_vocab  # noqa: E402

N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF, N_VOCAB = 2048, 16, 32, 8, 8192, 128_256


def vocab() -> tuple[list[str], list[float], list[int]]:
    """The tiny model's SentencePiece vocabulary, padded with made-up words to the full size."""
    pieces, scores, types = build_vocab()
    extra = N_VOCAB - len(pieces)
    pieces += [f"{SPACE}w{n}" for n in range(extra)]
    scores += [-1000.0 - n for n in range(extra)]
    types += [TokenType.NORMAL] * extra
    return pieces, scores, types


def write(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(path, "llama")
    writer.add_name("tui-chat random 1B (timing only)")
    writer.add_file_type(LlamaFileType.MOSTLY_Q8_0)
    writer.add_context_length(8192)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    pieces, scores, types = vocab()
    writer.add_vocab_size(len(pieces))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK_ID)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    def q8(shape: tuple[int, int], std: float) -> np.ndarray:
        return quantize(rng.standard_normal(shape, dtype=np.float32) * np.float32(std), GGMLQuantizationType.Q8_0)

    def add(name: str, shape: tuple[int, int], std: float) -> None:
        writer.add_tensor(name, q8(shape, std), raw_dtype=GGMLQuantizationType.Q8_0)

    ones = np.ones(N_EMBD, dtype=np.float32)
    head = N_EMBD // N_HEAD
    add("token_embd.weight", (N_VOCAB, N_EMBD), 1.0)  # numpy (rows, cols) = ggml's {ne0, ne1} reversed
    writer.add_tensor("output_norm.weight", ones)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", ones)
        add(p + "attn_q.weight", (N_HEAD * head, N_EMBD), N_EMBD**-0.5)
        add(p + "attn_k.weight", (N_HEAD_KV * head, N_EMBD), N_EMBD**-0.5)
        add(p + "attn_v.weight", (N_HEAD_KV * head, N_EMBD), N_EMBD**-0.5)
        add(p + "attn_output.weight", (N_EMBD, N_HEAD * head), N_EMBD**-0.5)
        writer.add_tensor(p + "ffn_norm.weight", ones)
        add(p + "ffn_gate.weight", (N_FF, N_EMBD), N_EMBD**-0.5)
        add(p + "ffn_up.weight", (N_FF, N_EMBD), N_EMBD**-0.5)
        add(p + "ffn_down.weight", (N_EMBD, N_FF), N_FF**-0.5)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="where to write the .gguf")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    write(args.path, args.seed)
    print(f"{args.path}: {args.path.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
