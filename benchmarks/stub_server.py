"""A stub OpenAI-compatible server that streams a fixed reply at an exact rate: a real token source in a process
of its own, for measuring the whole app as a fast model's server feeds it.

    python benchmarks/stub_server.py PORT STATS.json [--rate 5000] [--tokens 20000] [--paragraph]

`GET /v1/models` names one model (`stub`); `POST /v1/chat/completions` with `"stream": true` sends one chunk a
token, each due at t0 + i / rate, every chunk that is due written at once (a late wake-up catches up, it never falls
behind), then a usage chunk and `[DONE]`. After each reply it writes what it sent to STATS.json: the tokens, the
first and last send times (`time.perf_counter`, one clock with the app on Linux) and its own rate. A client that
hangs up ends the reply there (`stopped` in the stats). The reply is the UI benchmark's Markdown, or with
--paragraph one paragraph of plain words (the case where a whole paragraph used to be wrapped at every frame).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from synthetic import WORDS, markdown_reply, split_tokens


class Stub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, stats: Path, pieces: list[str], rate: float) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.stats, self.pieces, self.rate = stats, pieces, rate


class Handler(BaseHTTPRequestHandler):
    server: Stub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._json({"object": "list", "data": [{"id": "stub", "object": "model", "owned_by": "stub"}]})
        else:
            self._json({"error": {"message": "not found", "type": "not_found"}}, 404)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if not self.path.endswith("/chat/completions") or not body.get("stream"):
            self._json({"error": {"message": "the stub streams chat completions only", "type": "invalid"}}, 400)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self._stream(min(len(self.server.pieces), int(body.get("max_tokens") or len(self.server.pieces))))

    def _stream(self, count: int) -> None:
        pieces, rate = self.server.pieces[:count], self.server.rate
        self._send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        start = time.perf_counter()
        first = last = start
        sent, stopped = 0, False
        try:
            while sent < count:
                due = min(count, int((time.perf_counter() - start) * rate) + 1)
                chunk = b"".join(_event({"choices": [{"index": 0, "delta": {"content": piece}}]})
                                 for piece in pieces[sent:due])
                self.wfile.write(chunk)
                self.wfile.flush()
                last = time.perf_counter()
                first = first if sent else last
                sent = due
                if sent < count:
                    time.sleep(max(0.0, start + sent / rate - time.perf_counter()))
            self._send({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                        "usage": {"prompt_tokens": 8, "completion_tokens": sent, "total_tokens": 8 + sent}})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            stopped = True
        self.server.stats.write_text(json.dumps({
            "tokens": sent, "first": first, "last": last, "stopped": stopped, "offered_tok_s": rate,
            "sent_tok_s": (sent - 1) / (last - first) if sent > 1 and last > first else None}))

    def _send(self, payload: dict) -> None:
        self.wfile.write(_event(payload))
        self.wfile.flush()

    def _json(self, payload: dict, status: int = 200) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def reply_pieces(tokens: int, paragraph: bool, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    if paragraph:
        text = " ".join(rng.choice(WORDS) for _ in range(tokens)).capitalize()
    else:
        text = markdown_reply(rng, tokens)
    return split_tokens(text)[:tokens]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", type=int)
    parser.add_argument("stats", type=Path)
    parser.add_argument("--rate", type=float, default=5000.0)
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--paragraph", action="store_true")
    args = parser.parse_args()
    Stub(args.port, args.stats, reply_pieces(args.tokens, args.paragraph), args.rate).serve_forever()


if __name__ == "__main__":
    main()
