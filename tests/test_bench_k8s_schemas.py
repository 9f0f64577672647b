"""The held-out split's bundling (benchmarks/k8s_schemas.py): references into another file, a sibling file
and a schema's own recursion all end as local `#/$defs/...` that jsonschema follows with nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def _tree(folder: Path) -> None:
    """A tiny kubernetes-json-schema-like folder: `$id`s under one host, `$ref`s to `/api/_definitions.json`."""
    definitions = {"$id": "https://k8s.test/api/_definitions.json", "$defs": {
        "Meta": {"type": "object", "properties": {"name": {"type": "string"},
                                                  "owner": {"$ref": "#/$defs/Meta"}}},
        "Unused": {"type": "integer"}}}
    pod = {"$id": "https://k8s.test/api/pod/v1", "$schema": "https://json-schema.org/draft/2020-12/schema",
           "type": "object", "additionalProperties": False,
           "properties": {"metadata": {"$ref": "/api/_definitions.json#/$defs/Meta"},
                          "port": {"$ref": "port.json"}, "children": {"type": "array", "items": {"$ref": "#"}}}}
    (folder / "_definitions.json").write_text(json.dumps(definitions))
    (folder / "pod-v1.json").write_text(json.dumps(pod))
    (folder / "port.json").write_text(json.dumps({"type": "integer", "minimum": 1}))


def test_bundling_makes_every_reference_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from k8s_schemas import Documents, bundle

    _tree(tmp_path)
    schema = bundle(tmp_path / "pod-v1.json", Documents(tmp_path))
    text = json.dumps(schema)
    assert "k8s.test" not in text and "$id" not in text
    assert set(schema["$defs"]) == {"Meta", "port"}
    assert schema["$defs"]["Meta"]["properties"]["owner"] == {"$ref": "#/$defs/Meta"}
    assert schema["properties"]["children"]["items"] == {"$ref": "#"}
    validator = jsonschema.Draft202012Validator(schema)
    good = {"metadata": {"name": "a", "owner": {"name": "b"}}, "port": 80, "children": [{"port": 1}]}
    assert validator.is_valid(good)
    assert not validator.is_valid({"metadata": {"owner": {"name": 1}}})
    assert not validator.is_valid({"port": 0})
    assert not validator.is_valid({"children": [{"extra": 1}]})


def test_a_reference_to_a_missing_file_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from k8s_schemas import Documents, bundle

    (tmp_path / "a.json").write_text(json.dumps({"$ref": "b.json#/x"}))
    with pytest.raises(ValueError, match="b.json: no such file"):
        bundle(tmp_path / "a.json", Documents(tmp_path))
