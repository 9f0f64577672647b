"""Tiny random-weight GGUF model for fast tests against real llama.cpp.

The model is a genuine ``llama``-architecture GGUF with its own small
SentencePiece-style vocabulary, so llama.cpp tokenizes, detokenizes and
samples from it exactly as it would from a real model, but it loads in
milliseconds and decodes thousands of tokens per second on a laptop CPU.
Nothing here depends on files outside this module: the vocabulary is built
in code and the weights come from a seeded numpy generator.

Run this file directly for a self-check that needs no pytest.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from gguf import GGUFWriter, LlamaFileType, TokenType

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2  # fewer KV heads than query heads, so grouped-query attention is exercised
N_LAYER = 2
N_FF = 128
CONTEXT_LENGTH = 4096

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
SPACE = "\u2581"  # SentencePiece's visible space, "▁"

# Words that become whole tokens when preceded by a space. All their
# "▁"-prefixes are added too, because llama.cpp's SPM tokenizer only merges
# two symbols when the merged text is itself a token.
WORDS = """
a about after again all also always an and any are around as ask at away
back be because been before being best better between big both but by
call came can capital city come could country day did do does down each
end even every few find first for from get give go good great had has have
he hello help her here him his how i if in into is it its just know last
left life like line little long look made make man many may me might more
most much must my name need never new next no not now number of off old on
once one only or other our out over own part people place point right said
same say see she should show since small so some something still such take
tell than that the their them then there these they thing think this those
three through time to too two under up us use very want was water way we
well went were what when where which while who why will with word work
world would write year yes yet you your
Hello Hi The This It I In A We You Paris France London England Berlin
Germany Rome Italy Madrid Spain Europe Python Llama Yes No
""".split()


def build_vocab() -> tuple[list[str], list[float], list[int]]:
    """Return (pieces, scores, token types) for a small SPM vocabulary.

    Layout: ``<unk>``, ``<s>``, ``</s>``, the 256 byte-fallback tokens (so
    any UTF-8 text round-trips), every printable ASCII character, then
    ``▁`` and the ``▁``-prefixes of ``WORDS``. Scores decrease down the
    list like SentencePiece log-probabilities.
    """
    pieces = ["<unk>", "<s>", "</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256

    normal: list[str] = [chr(c) for c in range(0x21, 0x7F)] + [SPACE]
    seen = set(normal)
    for word in WORDS:
        for end in range(1, len(word) + 1):
            piece = SPACE + word[:end]
            if piece not in seen:
                seen.add(piece)
                normal.append(piece)
    pieces += normal
    types += [TokenType.NORMAL] * len(normal)

    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(normal))]
    return pieces, scores, [int(t) for t in types]


def _weights(
    rng: np.random.Generator, pieces: list[str], types: list[int], eos_like: str | None
) -> dict[str, np.ndarray]:
    """Random weights scaled so the next-token distribution is spread out.

    Hidden layers use the usual 1/sqrt(fan_in) scale so attention and the
    FFN actually mix context in. Output rows are larger for whole words
    (logit std about 2.4 after the final RMS norm) so the top token usually
    gets a probability of 0.1-0.5 while greedy decoding stays deterministic.
    Rows for word fragments and bytes are damped so replies read mostly as
    whole words rather than fragments or stray (possibly invalid UTF-8)
    bytes. Control tokens (EOS included) get an all-zero row, i.e. a logit
    of exactly 0: reachable when sampling (p ~ 1e-4) but rare, so replies
    run to max_tokens. With ``eos_like``, EOS gets twice that piece's row, so
    EOS wins wherever the piece would have been the likeliest token.
    """
    n_vocab = len(types)
    head_dim = N_EMBD // N_HEAD

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float16)

    ones = np.ones(N_EMBD, dtype=np.float32)
    words = {SPACE + w for w in WORDS}
    row_scale = {TokenType.NORMAL: 0.15, TokenType.BYTE: 0.1}
    out_scale = np.array(
        [[0.3 if p in words else row_scale.get(t, 0.0)] for p, t in zip(pieces, types, strict=True)],
        dtype=np.float32,
    )

    output = (rng.standard_normal((n_vocab, N_EMBD)) * out_scale).astype(np.float16)
    if eos_like is not None:
        output[EOS_ID] = output[pieces.index(eos_like)] * 2
    # numpy shapes are (rows, cols) = ggml's {ne0, ne1} reversed.
    tensors = {
        "token_embd.weight": normal((n_vocab, N_EMBD), 1.0),
        "output_norm.weight": ones,
        "output.weight": output,
    }
    for i in range(N_LAYER):
        p = f"blk.{i}."
        tensors |= {
            p + "attn_norm.weight": ones,
            p + "attn_q.weight": normal((N_HEAD * head_dim, N_EMBD), N_EMBD**-0.5),
            p + "attn_k.weight": normal((N_HEAD_KV * head_dim, N_EMBD), N_EMBD**-0.5),
            p + "attn_v.weight": normal((N_HEAD_KV * head_dim, N_EMBD), N_EMBD**-0.5),
            p + "attn_output.weight": normal((N_EMBD, N_HEAD * head_dim), N_EMBD**-0.5),
            p + "ffn_norm.weight": ones,
            p + "ffn_gate.weight": normal((N_FF, N_EMBD), N_EMBD**-0.5),
            p + "ffn_up.weight": normal((N_FF, N_EMBD), N_EMBD**-0.5),
            p + "ffn_down.weight": normal((N_EMBD, N_FF), N_FF**-0.5),
        }
    return tensors


@dataclass(frozen=True)
class Vocab:
    """A tokenizer as a GGUF stores it: SentencePiece ("llama") or byte-level BPE ("gpt2", with `merges` and
    a pre-tokenizer such as "qwen2")."""

    model: str
    pieces: list[str]
    scores: list[float]
    types: list[int]
    bos: int | None
    eos: int
    add_bos: bool
    merges: list[str] = field(default_factory=list)
    pre: str | None = None
    unk: int | None = None
    add_space_prefix: bool = False


def spm_vocab() -> Vocab:
    pieces, scores, types = build_vocab()
    return Vocab("llama", pieces, scores, types, BOS_ID, EOS_ID, add_bos=True, unk=UNK_ID, add_space_prefix=True)


def write_gguf(
    path: pathlib.Path,
    vocab: Vocab,
    tensors: Mapping[str, np.ndarray],
    chat_template: str | Sequence[Mapping[str, str]] | None = None,
    n_layer: int = N_LAYER,
) -> pathlib.Path:
    """A llama-architecture GGUF of this module's shape with `vocab` and `tensors` (as `_weights` makes)."""
    path = pathlib.Path(path)
    writer = GGUFWriter(path, "llama")
    writer.add_name("tui-chat tiny test model")
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(vocab.pieces))

    writer.add_tokenizer_model(vocab.model)
    if vocab.pre is not None:
        writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.pieces)
    writer.add_token_scores(vocab.scores)
    writer.add_token_types(vocab.types)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    if vocab.unk is not None:
        writer.add_unk_token_id(vocab.unk)
    if vocab.bos is not None:
        writer.add_bos_token_id(vocab.bos)
    writer.add_eos_token_id(vocab.eos)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(vocab.add_space_prefix)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_model(
    path: pathlib.Path,
    seed: int = 0,
    chat_template: str | Sequence[Mapping[str, str]] | None = None,
    eos_like: str | None = None,
) -> pathlib.Path:
    """Write the tiny model to ``path`` and return ``path``.

    The same ``seed`` always yields a byte-identical file. No chat template
    is stored unless ``chat_template`` is given, so by default the model
    exercises the base-model (plain completion) path. A list of
    ``{"name": ..., "template": ...}`` stores named templates as Hugging Face
    conversions do: "default" as ``tokenizer.chat_template``, each other one
    as ``tokenizer.chat_template.<name>``.
    """
    vocab = spm_vocab()
    tensors = _weights(np.random.default_rng(seed), vocab.pieces, vocab.types, eos_like)
    return write_gguf(path, vocab, tensors, chat_template)


def _self_check() -> None:
    """Load the model with llama-cpp-python and check the properties tests rely on."""
    import tempfile
    import time

    import llama_cpp

    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_model(pathlib.Path(tmp) / "tiny.gguf")
        print(f"file: {path.stat().st_size} bytes")

        start = time.perf_counter()
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, verbose=False)
        print(f"load: {time.perf_counter() - start:.3f} s, n_vocab={llm.n_vocab()}")

        text = "Hello world, the capital of France is Paris."
        tokens = llm.tokenize(text.encode())
        back = llm.detokenize(tokens).decode()
        print(f"tokens ({len(tokens)}): {tokens}")
        assert tokens[0] == BOS_ID, tokens
        assert back == text, (back, text)

        def generate(**kwargs: object) -> str:
            start = time.perf_counter()
            out = llm.create_completion(text, max_tokens=50, **kwargs)
            elapsed = time.perf_counter() - start
            n = out["usage"]["completion_tokens"]
            reply = out["choices"][0]["text"]
            print(f"{kwargs}: {n} tokens, {n / elapsed:.0f} tok/s, "
                  f"finish={out['choices'][0]['finish_reason']}: {reply!r}")
            return reply

        greedy = [generate(temperature=0.0) for _ in range(2)]
        assert greedy[0] == greedy[1], greedy
        sampled = [generate(temperature=1.0, seed=s) for s in (1, 2)]
        assert sampled[0] != sampled[1], sampled
    print("ok")


if __name__ == "__main__":
    _self_check()
