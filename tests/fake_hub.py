"""A small Hugging Face hub on 127.0.0.1: the API paths huggingface_hub and tui-chat call, with faults on demand.

Serves `GET /api/models?search=…` (search), `GET /api/models/{repo}` and `/revision/{rev}` (model
info), `GET /api/models/{repo}/tree/{rev}` (file listing, paginated with a `Link` header) and
`HEAD`/`GET /{repo}/resolve/{rev}/{file}`. LFS files answer `resolve` with a 302 to a CDN path, as
the real hub does, carrying `X-Repo-Commit`, `X-Linked-Etag` and `X-Linked-Size`; the CDN path
honours `Range` with 206. Point tui-chat at it with `HF_ENDPOINT`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

POINTER_SIZE = 134
REPO = "tiny-org/tiny-GGUF"  # the names the hub tests serve the tiny model under
FILE = "tiny-Q4_K_M.gguf"
REF = f"{REPO}:{FILE}"


@dataclass
class FakeFile:
    data: bytes
    lfs: bool = True

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_sha1(self) -> str:
        return hashlib.sha1(f"blob {len(self.data)}\0".encode() + self.data).hexdigest()


@dataclass
class FakeRepo:
    files: dict[str, FakeFile]
    commit: str
    downloads: int = 0
    likes: int = 0
    private: bool = False
    gated: bool = False


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Message  # case-insensitive, as HTTP headers are


@dataclass
class Faults:
    """Switches a test flips: each names what goes wrong and for how long."""

    cut_after: dict[str, list[int]] = field(default_factory=dict)  # file → byte counts, one per request, then fine
    stall_after: dict[str, int] = field(default_factory=dict)  # file → send this many bytes then wait for `release`
    wrong_content: set[str] = field(default_factory=set)
    ignore_range: bool = False
    status: int | None = None  # every API and file answer gets this status
    garbage: bool = False  # API answers that are not JSON
    release: threading.Event = field(default_factory=threading.Event)


class FakeHub:
    def __init__(self, token: str | None = None, page_size: int = 1000) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.seen: list[Seen] = []
        self.faults = Faults()
        self.token = token
        self.page_size = page_size
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def add_repo(self, repo: str, files: dict[str, bytes | FakeFile], **settings) -> FakeRepo:
        files = {path: data if isinstance(data, FakeFile) else FakeFile(data) for path, data in files.items()}
        commit = hashlib.sha1(repo.encode() + b"".join(sorted(f.sha256.encode() for f in files.values()))).hexdigest()
        self.repos[repo] = FakeRepo(files, commit, **settings)
        return self.repos[repo]

    def requests(self, kind: str) -> list[Seen]:
        return [seen for seen in self.seen if kind in seen.path]

    def __enter__(self) -> FakeHub:
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.faults.release.set()
        self._server.shutdown()
        self._server.server_close()


_MODEL = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_CDN = re.compile(r"^/cdn/(?P<repo>[^/]+/[^/]+)/(?P<file>.+)$")


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_HEAD(self) -> None:
            self._answer(head=True)

        def do_GET(self) -> None:
            self._answer(head=False)

        def _answer(self, head: bool) -> None:
            url = urlsplit(self.path)
            path, query = unquote(url.path), parse_qs(url.query)
            hub.seen.append(Seen(self.command, path, query, self.headers))
            if hub.faults.status is not None:
                return self._json(hub.faults.status, {"error": "fault"})
            if path == "/api/models":
                return self._search(query)
            for pattern, serve in ((_TREE, self._tree), (_MODEL, self._info), (_RESOLVE, self._resolve),
                                   (_CDN, self._cdn)):
                match = pattern.match(path)
                if match:
                    repo = self._repo(match["repo"])
                    if repo is not None:
                        serve(repo, match, query, head)
                    return
            self._json(404, {"error": "no such path"})

        def _repo(self, name: str) -> FakeRepo | None:
            repo = hub.repos.get(name)
            authorization = self.headers.get("Authorization")
            if repo is None:
                self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            elif repo.private and authorization != f"Bearer {hub.token}":
                self._json(401, {"error": "Invalid username or password."})
            elif repo.gated and authorization is None:
                self._json(401, {"error": "Access to this model is restricted."})
            elif repo.gated and authorization != f"Bearer {hub.token}":
                self._json(403, {"error": "gated"}, {"X-Error-Code": "GatedRepo"})
            else:
                return repo
            return None

        def _search(self, query: dict) -> None:
            if hub.faults.garbage:
                return self._raw(200, b"<html>not json", "text/html")
            text = query.get("search", [""])[0].lower()
            wanted = [
                (name, repo) for name, repo in hub.repos.items()
                if text in name.lower() and ("gguf" not in query.get("filter", [])
                                             or any(p.endswith(".gguf") for p in repo.files))
            ]
            key = query.get("sort", ["downloads"])[0]
            wanted.sort(key=lambda item: -getattr(item[1], key))
            limit = int(query.get("limit", ["1000"])[0])
            self._json(200, [{"id": name, "downloads": repo.downloads, "likes": repo.likes, "tags": ["gguf"]}
                             for name, repo in wanted[:limit]])

        def _info(self, repo: FakeRepo, match, query, head) -> None:
            if hub.faults.garbage:
                return self._json(200, {"id": match["repo"], "sha": "not a commit"})
            self._json(200, {"id": match["repo"], "sha": repo.commit, "private": repo.private, "gated": repo.gated,
                             "siblings": [{"rfilename": path} for path in repo.files]})

        def _tree(self, repo: FakeRepo, match, query, head) -> None:
            if match["rev"] not in (repo.commit, "main"):
                return self._json(404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"})
            entries = []
            for folder in sorted({p.rsplit("/", 1)[0] for p in repo.files if "/" in p}):
                entries.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": folder})
            for path, file in sorted(repo.files.items()):
                entry = {"type": "file", "oid": file.git_sha1, "size": len(file.data), "path": path}
                if file.lfs:
                    entry["lfs"] = {"oid": file.sha256, "size": len(file.data), "pointerSize": POINTER_SIZE}
                entries.append(entry)
            start = int(query.get("cursor", ["0"])[0])
            page, rest = entries[start:start + hub.page_size], entries[start + hub.page_size:]
            link = {}
            if rest:
                link["Link"] = f'<{hub.url}{urlsplit(self.path).path}?cursor={start + hub.page_size}>; rel="next"'
            self._json(200, page, link)

        def _resolve(self, repo: FakeRepo, match, query, head) -> None:
            file = repo.files.get(match["file"])
            if match["rev"] not in (repo.commit, "main") or file is None:
                return self._json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
            headers = {"X-Repo-Commit": repo.commit}
            if not file.lfs:
                return self._bytes(match["file"], file, head, headers | {"ETag": f'"{file.git_sha1}"'})
            self.send_response(302)
            for name, value in (headers | {
                "Location": f"/cdn/{match['repo']}/{match['file']}",
                "X-Linked-Etag": f'"{file.sha256}"',
                "X-Linked-Size": str(len(file.data)),
                "ETag": f'"{file.git_sha1}"',
                "Content-Length": "0",
            }).items():
                self.send_header(name, value)
            self.end_headers()

        def _cdn(self, repo: FakeRepo, match, query, head) -> None:
            file = repo.files.get(match["file"])
            if file is None:
                return self._json(404, {"error": "no such object"})
            self._bytes(match["file"], file, head, {"ETag": f'"{file.sha256}"'})

        def _bytes(self, name: str, file: FakeFile, head: bool, headers: dict[str, str]) -> None:
            data = file.data
            if name in hub.faults.wrong_content:
                data = data[:-1] + bytes([data[-1] ^ 0xFF])
            start = 0
            ranged = re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))
            if ranged and not hub.faults.ignore_range:
                start = int(ranged[1])
                if start >= len(data):
                    return self._raw(416, b"", "text/plain", {"Content-Range": f"bytes */{len(data)}"})
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            for header, value in (headers | {"Accept-Ranges": "bytes", "Content-Length": str(len(data) - start),
                                             "Content-Type": "application/octet-stream"}).items():
                self.send_header(header, value)
            self.end_headers()
            if head:
                return
            body = data[start:]
            cuts = hub.faults.cut_after.get(name)
            if cuts:
                self.wfile.write(body[: cuts.pop(0)])
                self.wfile.flush()
                self.close_connection = True
                return
            stall = hub.faults.stall_after.get(name)
            if stall is not None:
                self.wfile.write(body[:stall])
                self.wfile.flush()
                hub.faults.release.wait(30)
                self.close_connection = True
                return
            self.wfile.write(body)

        def _json(self, status: int, value, headers: dict[str, str] | None = None) -> None:
            self._raw(status, json.dumps(value).encode(), "application/json", headers)

        def _raw(self, status: int, body: bytes, kind: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in ({"Content-Type": kind, "Content-Length": str(len(body))} | (headers or {})).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler
