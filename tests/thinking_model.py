"""Tiny models that say a fixed script, with a real chat template and a vocabulary shaped like the real one.

The vocabulary is byte-level BPE as Qwen's (llama.cpp's "gpt2" model with the "qwen2" pre-tokenizer): the
256 byte symbols, merges that make each word of the script one token, and the family's special tokens
with their real types (`<|im_end|>` a control token that ends a turn, `<think>` and `</think>` user-defined
ones that print). llama.cpp tokenizes and detokenizes it as it does Qwen3's.

The weights are set by hand so the next token depends only on the current one: every layer adds nothing
(zero output projections), each scripted token's embedding is its own axis, and the output row of its
successor points along that axis. So after the prompt's last token the model says the script, token by
token, with probability ~1, and any token off the script is followed by the end of the turn. A script
that comes back to a token loops.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from itertools import pairwise

import numpy as np
from gguf import TokenType

from tiny_model import N_EMBD, N_FF, N_HEAD, N_HEAD_KV, N_LAYER, Vocab, write_gguf

QWEN_SPECIALS = {"<|endoftext|>": TokenType.CONTROL, "<|im_start|>": TokenType.CONTROL,
                 "<|im_end|>": TokenType.CONTROL, "<think>": TokenType.USER_DEFINED,
                 "</think>": TokenType.USER_DEFINED}
DEEPSEEK_SPECIALS = {"<｜begin▁of▁sentence｜>": TokenType.CONTROL, "<｜end▁of▁sentence｜>": TokenType.CONTROL,
                     "<｜User｜>": TokenType.USER_DEFINED, "<｜Assistant｜>": TokenType.USER_DEFINED,
                     "<think>": TokenType.USER_DEFINED, "</think>": TokenType.USER_DEFINED}
# Qwen3's generation prompt ends with "\n": then the model opens its thinking, thinks four tokens and answers.
THOUGHT = ["\n", "<think>", "Hmm", ",", " let", " me", "</think>", "Hello", " world", " "]
LOGIT = 2.0  # times 8 after the RMS norm: the scripted successor leads every other token by 16
TEMPLATES = pathlib.Path(__file__).parent / "templates"


def template(name: str) -> str:
    """One of llama.cpp's shipped templates (tests/templates/NAME.jinja)."""
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


BYTES = _byte_symbols()


def encode(text: str) -> str:
    """Text in the byte-level alphabet the vocabulary stores."""
    return "".join(BYTES[b] for b in text.encode("utf-8"))


def bpe_vocab(words: Sequence[str], specials: dict[str, TokenType], bos: str | None, eos: str,
              add_bos: bool = False, pre: str = "qwen2") -> Vocab:
    """Bytes, then each word made one token by a left-to-right chain of merges, then the special tokens."""
    pieces = list(BYTES)
    merges: list[str] = []
    for word in words:
        if word in specials:
            continue
        symbols = encode(word)
        for end in range(2, len(symbols) + 1):
            merge = f"{symbols[: end - 1]} {symbols[end - 1]}"
            if symbols[:end] not in pieces:
                pieces.append(symbols[:end])
                merges.append(merge)
    types = [int(TokenType.NORMAL)] * len(pieces)
    for text, kind in specials.items():
        pieces.append(text)
        types.append(int(kind))
    return Vocab("gpt2", pieces, [0.0] * len(pieces), types, pieces.index(bos) if bos else None,
                 pieces.index(eos), add_bos=add_bos, merges=merges, pre=pre)


def token_of(vocab: Vocab, text: str) -> int:
    encoded = encode(text)
    return vocab.pieces.index(encoded if encoded in vocab.pieces else text)


def _scripted_weights(vocab: Vocab, scripts: Sequence[Sequence[str]], n_layer: int) -> dict[str, np.ndarray]:
    successor: dict[int, int] = {}
    for script in scripts:
        ids = [token_of(vocab, piece) for piece in script]
        for current, following in pairwise(ids):
            assert successor.setdefault(current, following) == following, f"{script}: a token with two successors"
        successor.setdefault(ids[-1], vocab.eos)
    slots = {token: slot for slot, token in enumerate(successor, start=1)}
    assert len(slots) < N_EMBD, "more scripted tokens than the embedding has axes"
    n_vocab, head_dim = len(vocab.pieces), N_EMBD // N_HEAD
    embedding = np.zeros((n_vocab, N_EMBD), dtype=np.float16)
    embedding[:, 0] = 1.0  # off the script: axis 0, whose successor is the end of the turn
    output = np.zeros((n_vocab, N_EMBD), dtype=np.float16)
    output[vocab.eos, 0] = LOGIT
    for token, slot in slots.items():
        embedding[token] = 0.0
        embedding[token, slot] = 1.0
        output[successor[token], slot] = LOGIT
    zeros = {
        "attn_q.weight": (N_HEAD * head_dim, N_EMBD), "attn_k.weight": (N_HEAD_KV * head_dim, N_EMBD),
        "attn_v.weight": (N_HEAD_KV * head_dim, N_EMBD), "attn_output.weight": (N_EMBD, N_HEAD * head_dim),
        "ffn_gate.weight": (N_FF, N_EMBD), "ffn_up.weight": (N_FF, N_EMBD), "ffn_down.weight": (N_EMBD, N_FF),
    }
    tensors = {"token_embd.weight": embedding, "output_norm.weight": np.ones(N_EMBD, dtype=np.float32),
               "output.weight": output}
    for layer in range(n_layer):
        tensors[f"blk.{layer}.attn_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
        tensors[f"blk.{layer}.ffn_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
        tensors |= {f"blk.{layer}.{name}": np.zeros(shape, dtype=np.float16) for name, shape in zeros.items()}
    return tensors


def write_thinker(path: pathlib.Path) -> pathlib.Path:
    """Qwen3's template and vocabulary; it thinks "Hmm, let me", then answers "Hello world " (trailing blank
    included, so a reply's exact text can be told from a stripped one)."""
    return write_scripted_model(path, template("Qwen-Qwen3-0.6B"), THOUGHT, words=["Hi", "Again"])


def write_scripted_model(path: pathlib.Path, chat_template: str | None, script: Sequence[str], *,
                         specials: dict[str, TokenType] = QWEN_SPECIALS, bos: str | None = "<|endoftext|>",
                         eos: str = "<|im_end|>", add_bos: bool = False, pre: str = "qwen2",
                         n_layer: int = N_LAYER, words: Sequence[str] = (),
                         also: Sequence[Sequence[str]] = ()) -> pathlib.Path:
    """A model that, after `script[0]` (the prompt's last token), says the rest of `script`, then `eos`
    unless the script loops. `also`: more scripts, followed wherever their first token comes (one the engine
    writes, say). `words`: more tokens for the vocabulary (what prompts will hold)."""
    vocab = bpe_vocab([*script, *(piece for more in also for piece in more), *words], specials, bos, eos, add_bos,
                      pre)
    return write_gguf(path, vocab, _scripted_weights(vocab, [script, *also], n_layer), chat_template, n_layer)
