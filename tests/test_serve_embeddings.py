"""`tui-chat serve`'s `/v1/embeddings` as a client sees it: the official `openai` client (and raw HTTP for what it would
not send) against the real command on the starter, the tiny model as a dedicated embedding model beside it
(`--embeddings`), and the engine's `embed` through its own process."""

from __future__ import annotations

import base64
import json
import threading
from functools import partial

import numpy as np
import pytest

from conftest import GREEDY
from test_serve import client, post, server, server_home, serving  # noqa: F401 - fixtures used by name
from tiny_model import N_EMBD
from tui_chat.engine.base import Done, Embedded, InputRefused, Message, Request
from tui_chat.engine.factory import local_backend
from tui_chat.engine.local.embed import EMBED_TOKENS
from tui_chat.engine.local.settings import LlamaSettings
from tui_chat.engine.params import LiveParams
from tui_chat.engine.process import LocalEngineProcess

STARTER_SIZE = 640  # Gemma 3 270M's hidden size
# Measured on the starter (mean pooling, 2026-12, AMD EPYC): cosine 0.94 (cat, cat again) against 0.62 (cat, money),
# 0.91 (bread, bread again) against 0.68 (bread, stocks): margins of 0.32 and 0.23, of which the test asks 0.1.
CAT, CAT_AGAIN, MONEY = ("The cat sat on the mat.", "A cat was sitting on the rug.",
                         "Quarterly revenue grew by ten percent.")
BREAD, BREAD_AGAIN, STOCKS = ("How do I bake bread at home?", "What is a simple recipe for homemade bread?",
                              "The stock market closed lower today.")
MARGIN = 0.1
PROMPT = [{"role": "user", "content": "Name three colours of the sea."}]


def embeddings_url(url: str) -> str:
    return f"{url}/embeddings"


def refused(url: str, body: dict) -> tuple[int, dict]:
    status, answer, _ = post(embeddings_url(url), json.dumps(body).encode())
    return status, answer["error"] if status != 200 else answer


def vectors(url: str, texts: list[str], **options) -> np.ndarray:
    answer = client(url).embeddings.create(model="", input=texts, encoding_format="float", **options)
    return np.array([item.embedding for item in answer.data])


def test_two_texts_are_two_unit_vectors_of_the_models_size(server):  # noqa: F811
    chat = client(server)
    [model] = chat.models.list().data
    answer = chat.embeddings.create(model=model.id, input=[CAT, MONEY], encoding_format="float")
    assert answer.model == model.id and answer.object == "list"
    assert [item.index for item in answer.data] == [0, 1]
    found = np.array([item.embedding for item in answer.data])
    assert found.shape == (2, STARTER_SIZE)
    assert np.allclose(np.linalg.norm(found, axis=1), 1.0, atol=1e-5)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens >= 2 * 5
    one = chat.embeddings.create(model=model.id, input=CAT, encoding_format="float")  # a string alone: one vector
    assert np.array_equal(one.data[0].embedding, found[0])  # read alone either way: the same floats
    assert one.usage.prompt_tokens < answer.usage.prompt_tokens


def test_base64_is_the_same_float32s_little_endian(server):  # noqa: F811
    texts = [CAT, BREAD]
    floats = vectors(server, texts)
    raw = client(server).embeddings.create(model="", input=texts, encoding_format="base64")
    assert all(isinstance(item.embedding, str) for item in raw.data)
    decoded = np.array([np.frombuffer(base64.b64decode(item.embedding), dtype="<f4") for item in raw.data])
    assert np.array_equal(decoded.astype(np.float64), floats)
    unasked = client(server).embeddings.create(model="", input=texts)  # the SDK asks for base64 and decodes it
    assert np.array_equal(np.array([item.embedding for item in unasked.data]), floats)


def test_a_paraphrase_is_closer_than_an_unrelated_text(server):  # noqa: F811
    cat, cat_again, money, bread, bread_again, stocks = vectors(
        server, [CAT, CAT_AGAIN, MONEY, BREAD, BREAD_AGAIN, STOCKS])
    assert cat @ cat_again > cat @ money + MARGIN
    assert bread @ bread_again > bread @ stocks + MARGIN


def test_embeddings_leave_the_chat_as_it_was(server):  # noqa: F811
    """A context of their own: a greedy reply is the same before and after, and while, texts are embedded."""
    chat = client(server)

    def reply() -> str:
        return chat.chat.completions.create(model="", messages=PROMPT, max_tokens=16, temperature=0) \
            .choices[0].message.content

    reply()  # then each reply reads PROMPT from the slot's cache alike (a fresh read parts at near-ties on Intel)
    before = reply()
    vectors(server, [CAT, BREAD * 20])
    during: list[str] = []
    writer = threading.Thread(target=lambda: during.append(reply()))
    writer.start()
    vectors(server, [MONEY, STOCKS * 10])
    writer.join(120)
    assert reply() == before and during == [before]


@pytest.mark.parametrize(("body", "param"), [
    ({"input": [1, 2, 3]}, "input"),
    ({"input": [[1, 2], [3]]}, "input"),
    ({"input": []}, "input"),
    ({"input": 7}, "input"),
    ({"input": ["fine", ""]}, "input"),
    ({}, "input"),
    ({"input": "fine", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "fine", "dimensions": 0}, "dimensions"),
    ({"input": "fine", "dimensions": "640"}, "dimensions"),
    ({"input": "fine", "dimensions": 256}, "dimensions"),
])
def test_bad_fields_are_refused_naming_them(server, body, param):  # noqa: F811
    status, error = refused(server, body)
    assert status == 400 and error["param"] == param and error["type"] == "invalid_request_error", error


def test_a_text_longer_than_the_embedding_context_is_refused_with_the_limit(server):  # noqa: F811
    status, error = refused(server, {"input": [CAT, "word " * (EMBED_TOKENS + 10)]})
    assert status == 400 and error["param"] == "input" and "input[1]" in error["message"]
    assert f"{EMBED_TOKENS:,}" in error["message"]
    assert refused(server, {"input": "fine", "dimensions": STARTER_SIZE})[0] == 200  # its own size is no change


def test_a_dedicated_embedding_model_beside_the_chat_model(starter_model, tiny_model, tmp_path):
    with serving(starter_model, tmp_path, "--embeddings", str(tiny_model)) as url:
        chat = client(url)
        assert [model.id for model in chat.models.list().data] == [starter_model.stem, "tiny"]
        assert chat.models.retrieve("tiny").id == "tiny"
        answer = chat.embeddings.create(model="tiny", input=["Hello world", "Paris France"], encoding_format="float")
        assert answer.model == "tiny"
        found = np.array([item.embedding for item in answer.data])
        assert found.shape == (2, N_EMBD) and np.allclose(np.linalg.norm(found, axis=1), 1.0, atol=1e-5)
        status, error = refused(url, {"input": "x", "model": starter_model.stem})  # the embeddings are tiny's
        assert status == 404 and error["param"] == "model"
        assert chat.chat.completions.create(model="", messages=PROMPT, max_tokens=4, temperature=0).model \
            == starter_model.stem


def test_embed_through_the_engine_process_beside_a_reply(tiny_model, tmp_path):
    """The engine's call, across its process: the vectors as bytes, a refusal as its own error; a reply decoded at
    the same time on the worker is the reply decoded alone."""
    logs = tmp_path / "logs"
    engine = LocalEngineProcess(partial(local_backend, LlamaSettings(tiny_model, n_ctx=1024), "tiny", logs), logs)
    try:
        assert engine.load().result().__class__.__name__ == "Loaded"
        request = [Message("user", "Hello, tell me about Paris and France.")]

        def reply() -> Done:
            done = engine.generate(Request(request, LiveParams(GREEDY.with_changes(max_tokens=400)))).result()
            assert isinstance(done, Done)
            return done

        reply()  # then both replies below read the prompt from the cache alike
        alone = reply()
        stream = engine.generate(Request(request, LiveParams(GREEDY.with_changes(max_tokens=400))))
        embedded = [engine.embed(["Hello world", "Paris France", "Hello world"]) for _ in range(5)]
        beside = stream.result()
        assert isinstance(beside, Done) and beside.text == alone.text
        first = embedded[0]
        assert isinstance(first, Embedded) and first.model == "tiny" and first.size == N_EMBD
        assert len(first.data) == 3 * N_EMBD * 4 and first.vector(0) == first.vector(2) != first.vector(1)
        assert all(one == first for one in embedded)
        with pytest.raises(InputRefused, match="at most 512 tokens"):
            engine.embed(["Paris " * 600])
    finally:
        engine.close()

