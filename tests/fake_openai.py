"""A small OpenAI-compatible server on 127.0.0.1 that misbehaves on request, for the remote backend's faults.

The model id picks the behaviour (see `BEHAVIOURS`; a path such as `/models/words.gguf`, as llama-server
names its model, picks the behaviour of its file's stem). The well-behaved model, "words", answers in the
wire format of llama.cpp's llama-server (`family`, the default): `/props`, `/tokenize`, token ids with
the logprobs, `prompt_progress` and `timings` with every chunk when asked (`return_progress`,
`timings_per_token`), a final chunk with `usage` (cached tokens included), and a last assistant message
continued rather than answered (its text sent back first, without probabilities). `family="vllm"` answers
as vLLM does (`owned_by`, usage with every chunk when asked), `family="openai"` as a plain OpenAI-compatible
server. Its tokens are words, and its prompt
cache is the common word prefix with the previous request, so its reports can be checked by hand.

Every wait is bounded, so a test that forgets to stop it cannot hang the suite.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hostile import CANDIDATES, HOSTILE

REPLY = "Paris is the capital of France and its largest city ."
CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
FTYPE = "Q4_K - Medium"
ALTERNATIVE = " Lyon"  # the second likeliest token everywhere, when logprobs are asked for
SLOW_TOKEN_S = 0.2
MAX_WAIT_S = 10.0
BEHAVIOURS = ("words", "slow", "cut", "cut-chunked", "malformed", "server-error", "error-event", "hang", "silent-end",
              "hostile", "hostile-error", "interrupted", "thinking", "stopping", "tools", "no-tools")
THOUGHT = ("Hmm", ",", " let", " me", " see")  # "thinking" sends these as reasoning_content, then REPLY
# "stopping" writes these, one every PACED_TOKEN_S, and ends on the request's stop string as llama-server does
# (measured against llama-cpp-python 0.3.36's vendored llama-server): tokens that might begin a stop string are
# held back and counted in its usage and timings; those of the stop string are never sent; held ones the next
# token clears come in one chunk with the next one's text, under one logprobs entry (the last token's); held ones
# at max tokens are never sent
PACED = ("Paris", " is", " the", " capital", " of", " France", ".", "\n", "User", ":", " And")
PACED_TOKEN_S = 0.03
# "tools" calls mcp-server-time's get_current_time for these zones, both in one reply (a user message naming
# "invalid" gets a call its schema refuses), streaming each call's arguments in pieces; after the results, it
# answers with the number of results it read. "no-tools" answers a request with tools as llama-server without
# --jinja does (400), and one without as "words" does.
ZONES = ("Asia/Tokyo", "Europe/Paris")
NO_JINJA = "tools param requires --jinja flag"


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, api_key: str | None = None, family: str = "llama-server", served: tuple[str, ...] = BEHAVIOURS,
                 chat_template: str = CHATML) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.api_key = api_key
        self.family = family  # llama-server, vllm, or openai (a plain server, without /props or /tokenize)
        self.served = served  # the ids /v1/models lists: a hostile server may name its models anything
        self.chat_template = chat_template  # what llama-server's /props says it renders chats with
        self.requests: list[dict] = []
        self.previous_prompt: list[str] = []
        self.stopping = threading.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}/v1"

    @property
    def llama_server(self) -> bool:
        return self.family == "llama-server"

    def handle_error(self, request, client_address) -> None:
        """A client hanging up mid-stream is what the cancel tests do: not worth a traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextmanager
def fake_server(api_key: str | None = None, family: str = "llama-server", served: tuple[str, ...] = BEHAVIOURS,
                chat_template: str = CHATML) -> Iterator[FakeServer]:
    server = FakeServer(api_key, family, served, chat_template)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()


def prompt_words(messages: list[dict]) -> list[str]:
    """The fake's tokenization of a conversation: a role marker, then the words of each message; a last
    assistant message is continued, so no new turn follows it."""
    words: list[str] = []
    for message in messages:
        words += [f"<{message['role']}>", *(message.get("content") or "").split()]
    return words if messages and messages[-1]["role"] == "assistant" else words + ["<assistant>"]


def token_id(word: str) -> int:
    """The fake's vocabulary: a word's id, the same in every run."""
    return zlib.crc32(word.strip().encode()) % 32_000


def behaviour(model: str) -> str:
    """The behaviour a model id picks: itself, or for a GGUF path, its file's stem."""
    return model.rsplit("/", 1)[-1].removesuffix(".gguf") if model.endswith(".gguf") else model


class _Handler(BaseHTTPRequestHandler):
    server: FakeServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    # --- plain JSON endpoints -----------------------------------------------------------------

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [self._model(name) for name in self.server.served]})
        elif self.path == "/props" and self.server.llama_server:
            props = {"default_generation_settings": {"n_ctx": 4096}, "chat_template": self.server.chat_template}
            self._json(200, props)
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if not self._authorized():
            return
        if self.path == "/tokenize" and self.server.family != "openai":
            self._json(200, {"tokens": list(range(len(body.get("content", body.get("prompt", "")).split())))})
        elif self.path == "/v1/chat/completions":
            self.server.requests.append(body)
            self._chat(body)
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def _model(self, name: str) -> dict:
        if self.server.family == "vllm":
            return {"id": name, "object": "model", "owned_by": "vllm", "max_model_len": 8192}
        if self.server.llama_server:
            return {"id": name, "object": "model", "owned_by": "llamacpp", "meta": {"n_ctx": 4096, "ftype": FTYPE}}
        return {"id": name, "object": "model"}

    def _authorized(self) -> bool:
        key = self.server.api_key
        given = self.headers.get("Authorization", "")
        if key is None or given == f"Bearer {key}":
            return True
        # Like some real servers, echo what was sent: the client must not show it.
        self._json(401, {"error": {"message": f"invalid api key {given.removeprefix('Bearer ')!r}"}})
        return False

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # --- streamed chat --------------------------------------------------------------------------

    def _chat(self, body: dict) -> None:
        model = behaviour(str(body.get("model")))
        if model not in BEHAVIOURS:
            self._json(404, {"error": {"message": f"The model `{model}` does not exist."}})
            return
        if model == "no-tools" and body.get("tools"):
            self._json(400, {"error": {"code": 400, "message": NO_JINJA, "type": "invalid_request_error"}})
            return
        if model == "server-error":
            self._json(500, {"error": {"message": "CUDA error: out of memory"}})
            return
        if model == "hang":
            self.server.stopping.wait(MAX_WAIT_S)
            return
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if model == "cut-chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            first = _event(_chunk("Paris"))
            self.wfile.write(b"%x\r\n%s\r\n" % (len(first), first) + b"40\r\n" + _event(_chunk(" is"))[:20])
            return
        self.send_header("Connection", "close")
        self.end_headers()
        getattr(self, "_stream_" + model.replace("-", "_"))(body)

    def _send(self, payload: dict | str) -> None:
        self.wfile.write(_event(payload))
        self.wfile.flush()

    def _read_prompt(self, body: dict) -> tuple[list[str], int]:
        """The prompt's words and how many of them the cache held; says so first where asked (llama-server)."""
        prompt = prompt_words(body["messages"])
        previous = self.server.previous_prompt
        pairs = enumerate(zip(prompt, previous, strict=False))
        cached = next((i for i, (a, b) in pairs if a != b), min(len(prompt), len(previous)))
        self.server.previous_prompt = list(prompt)
        if self.server.llama_server and body.get("return_progress"):
            for processed, elapsed in ((cached, 0), (len(prompt), 12)):
                progress = {"total": len(prompt), "cache": cached, "processed": processed, "time_ms": elapsed}
                started = {"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}
                self._send({"object": "chat.completion.chunk", "choices": [started], "prompt_progress": progress})
        return prompt, cached

    def _timings(self, prompt: list[str], cached: int, written: int) -> dict:
        return {"cache_n": cached, "prompt_n": len(prompt) - cached, "prompt_ms": 12.5,
                "predicted_n": written, "predicted_ms": 40.0, "predicted_per_second": 250.0}

    def _usage(self, prompt: list[str], cached: int, written: int) -> dict:
        usage = {"prompt_tokens": len(prompt), "completion_tokens": written, "total_tokens": len(prompt) + written}
        return usage if self.server.family == "openai" else usage | {"prompt_tokens_details": {"cached_tokens": cached}}

    def _word(self, body: dict, piece: str, prompt: list[str], cached: int, written: int, record: str = "") -> None:
        """One token's chunk (`record`: the token its logprobs are of, where the chunk's text is more), with what
        the server was asked to report along with it."""
        chunk = _chunk(piece)
        if body.get("logprobs"):
            top = [{"token": record or piece, "logprob": -0.1}, {"token": ALTERNATIVE, "logprob": -2.5}]
            if self.server.llama_server:
                top = [entry | {"id": token_id(entry["token"])} for entry in top]
            chunk["choices"][0]["logprobs"] = {"content": [top[0] | {"top_logprobs": top}]}
        if self.server.llama_server and body.get("timings_per_token"):
            chunk["timings"] = self._timings(prompt, cached, written)
        if self.server.family == "vllm" and body.get("stream_options", {}).get("continuous_usage_stats"):
            chunk["usage"] = self._usage(prompt, cached, written)
        self._send(chunk)

    def _stream_words(self, body: dict) -> None:
        prompt, cached = self._read_prompt(body)
        messages = body["messages"]
        given = len(messages[-1]["content"].split()) if messages[-1]["role"] == "assistant" else 0
        words = REPLY.split()[given : given + body.get("max_tokens", 100)]
        self.server.previous_prompt += words
        self._send(": ping")
        if given and self.server.llama_server:  # as llama-server does, the continued message comes back first
            self._send(_chunk(messages[-1]["content"]))
        for index, word in enumerate(words):
            self._word(body, ("" if index + given == 0 else " ") + word, prompt, cached, index + 1)
        finish = "length" if given + len(words) < len(REPLY.split()) else "stop"
        self._send(_chunk(None, finish))
        final: dict = {"choices": [], "usage": self._usage(prompt, cached, len(words))}
        if self.server.llama_server:
            final["timings"] = self._timings(prompt, cached, len(words))
        self._send(final)
        self._send("[DONE]")

    def _stream_thinking(self, body: dict) -> None:
        """A reasoning model behind a server that parses its thinking out: reasoning_content deltas, then the
        answer; the budget cuts the thinking short as llama-server's and vLLM's fields ask (its `enable_thinking`
        off leaves none). vLLM names the thinking's tokens in its usage."""
        prompt, cached = self._read_prompt(body)
        budget = body.get("thinking_budget_tokens", body.get("thinking_token_budget", len(THOUGHT)))
        thinks = body.get("chat_template_kwargs", {}).get("enable_thinking", True)
        thought = THOUGHT[: max(budget, 0)] if thinks else ()
        for piece in thought:
            delta = {"reasoning" if self.server.family == "vllm" else "reasoning_content": piece}
            choice = {"index": 0, "delta": delta, "finish_reason": None}
            chunk = {"object": "chat.completion.chunk", "choices": [choice]}
            if body.get("logprobs"):
                chunk["choices"][0]["logprobs"] = {"content": [{"token": piece, "logprob": -0.2, "top_logprobs": [
                    {"token": piece, "logprob": -0.2}]}]}
            self._send(chunk)
        words = REPLY.split()
        for index, word in enumerate(words):
            self._word(body, ("" if index == 0 else " ") + word, prompt, cached, len(thought) + index + 1)
        self._send(_chunk(None, "stop"))
        usage = self._usage(prompt, cached, len(thought) + len(words))
        if self.server.family == "vllm":
            usage["completion_tokens_details"] = {"reasoning_tokens": len(thought)}
        self._send({"choices": [], "usage": usage})
        self._send("[DONE]")

    def _stream_tools(self, body: dict) -> None:
        prompt, cached = self._read_prompt(body)
        messages, choice = body["messages"], body.get("tool_choice", "auto")
        if not body.get("tools") or choice == "none" or messages[-1]["role"] == "tool":
            results = sum(message["role"] == "tool" for message in messages)
            words = f"I read {results} results .".split(" ")
            for index, word in enumerate(words):
                self._word(body, ("" if index == 0 else " ") + word, prompt, cached, index + 1)
            self._send(_chunk(None, "stop"))
        else:
            self._word(body, "Let me look .", prompt, cached, 1)
            invalid = "invalid" in messages[-1]["content"]
            arguments = [{"zone": zone} if invalid else {"timezone": zone} for zone in ZONES]
            for index, given in enumerate(arguments):
                text = json.dumps(given)
                head = {"index": index, "id": f"call_{index}_x", "type": "function",
                        "function": {"name": "get_current_time", "arguments": ""}}
                for piece in (head, *({"index": index, "function": {"arguments": text[at:at + 7]}}
                                      for at in range(0, len(text), 7))):
                    self._send({"object": "chat.completion.chunk",
                                "choices": [{"index": 0, "delta": {"tool_calls": [piece]}, "finish_reason": None}]})
            self._send(_chunk(None, "tool_calls"))
        self._send({"choices": [], "usage": self._usage(prompt, cached, 8)})
        self._send("[DONE]")

    def _stream_no_tools(self, body: dict) -> None:
        self._stream_words(body)

    def _stream_stopping(self, body: dict) -> None:
        prompt, cached = self._read_prompt(body)
        stops, held, sent, written = body.get("stop") or [], [], "", 0
        finish = "eos"
        for piece in PACED[: body.get("max_tokens") or len(PACED)]:
            time.sleep(PACED_TOKEN_S)
            written += 1
            held.append(piece)
            text = sent + "".join(held)
            if any(stop in text for stop in stops):
                finish = "stop"
                break
            if not any(text.endswith(stop[:n]) for stop in stops for n in range(1, len(stop))):
                self._word(body, "".join(held), prompt, cached, written, record=held[-1])
                sent, held = text, []
        else:
            finish = "length"
        self._send(_chunk(None, finish))
        timings = {"cache_n": cached, "prompt_n": len(prompt) - cached, "prompt_ms": 12.5, "predicted_n": written,
                   "predicted_ms": written * PACED_TOKEN_S * 1000, "predicted_per_second": 1 / PACED_TOKEN_S}
        self._send({"choices": [], "usage": self._usage(prompt, cached, written), "timings": timings})
        self._send("[DONE]")

    def _stream_slow(self, body: dict) -> None:
        prompt, cached = self._read_prompt(body)
        for index in range(int(MAX_WAIT_S / SLOW_TOKEN_S)):
            if self.server.stopping.is_set():
                return
            self._word(body, f" word{index}", prompt, cached, index + 1)
            time.sleep(SLOW_TOKEN_S)

    def _stream_cut(self, body: dict) -> None:
        for word in ("Paris", " is", " the"):
            self._send(_chunk(word))

    def _stream_malformed(self, body: dict) -> None:
        self._send(_chunk("Paris"))
        self._send(_chunk(" is"))
        self.wfile.write(b'data: {"choices": [{"delta": {"content": " the\n\n')
        self._send(_chunk(" capital"))
        self._send("[DONE]")

    def _stream_error_event(self, body: dict) -> None:
        self._send(_chunk("Paris"))
        self._send({"error": {"message": "the slot was cancelled by the server"}})

    def _stream_hostile(self, body: dict) -> None:
        """The untrusted text as word tokens, each with its probability and some hostile alternatives."""
        words = HOSTILE.split(" ")
        for index, word in enumerate(words):
            piece = ("" if index == 0 else " ") + word
            top = [{"token": piece, "logprob": -0.5}, *({"token": c, "logprob": -2.0} for c in CANDIDATES)]
            chunk = _chunk(piece)
            chunk["choices"][0]["logprobs"] = {"content": [{"token": piece, "logprob": -0.5, "top_logprobs": top}]}
            self._send(chunk)
        self._send(_chunk(None, "stop"))
        self._send("[DONE]")

    def _stream_hostile_error(self, body: dict) -> None:
        self._send(_chunk("Paris"))
        self._send({"error": {"message": HOSTILE}})

    def _stream_interrupted(self, body: dict) -> None:
        """As llama-cpp-python ends a stream when another request arrives: [DONE], with no finish reason."""
        self._send(_chunk("Paris"))
        self._send("[DONE]")

    def _stream_silent_end(self, body: dict) -> None:
        self._send(_chunk("Paris"))
        self._send(_chunk(" is", "stop"))


def _chunk(content: str | None, finish: str | None = None) -> dict:
    delta = {} if content is None else {"content": content}
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _event(payload: dict | str) -> bytes:
    if isinstance(payload, str):
        return (payload if payload.startswith(":") else f"data: {payload}").encode() + b"\n\n"
    return f"data: {json.dumps(payload)}\n\n".encode()
