import os

import pytest

from tui_chat.engine.base import EngineError
from tui_chat.engine.models import STARTER_NAME, check_gguf, resolve_model, starter_path


def test_missing_file(tmp_path):
    with pytest.raises(EngineError, match="model file not found: .*nope.gguf"):
        resolve_model(str(tmp_path / "nope.gguf"), None, tmp_path)


def test_not_gguf(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("hello, this is text")
    with pytest.raises(EngineError, match="is not a GGUF model file"):
        resolve_model(str(path), None, tmp_path)


def test_directory_and_unknown_version(tmp_path):
    with pytest.raises(EngineError, match="is a directory"):
        check_gguf(tmp_path)
    path = tmp_path / "future.gguf"
    path.write_bytes(b"GGUF" + (99).to_bytes(4, "little") + bytes(64))
    with pytest.raises(EngineError, match="GGUF version 99"):
        check_gguf(path)


def test_unknown_name(tmp_path):
    with pytest.raises(EngineError, match=f"unknown model 'mistral': give a path to a .gguf file, or {STARTER_NAME}"):
        resolve_model("mistral", None, tmp_path)


def test_configured_default_is_used(tiny_model, tmp_path):
    assert resolve_model(None, str(tiny_model), tmp_path) == tiny_model


def test_starter_is_the_default_and_unpacks_once(starter_model, tmp_path):
    assert resolve_model(None, None, starter_model.parent) == starter_model
    assert resolve_model("Gemma-3-270M", None, starter_model.parent) == starter_model
    stamp = starter_model.with_name(starter_model.name + ".verified")
    before = starter_model.stat().st_mtime_ns
    assert starter_path(starter_model.parent) == starter_model
    assert starter_model.stat().st_mtime_ns == before, "a verified starter model is not rewritten"
    assert stamp.read_text().split()[1] == str(starter_model.stat().st_size)


def test_damaged_starter_copy_is_replaced(starter_model, tmp_path):
    models = tmp_path / "models"
    target = starter_path(models)
    with target.open("r+b") as handle:
        handle.truncate(1000)
    assert starter_path(models).stat().st_size == starter_model.stat().st_size
    assert not (models / (target.name + ".partial")).exists()


def test_unwritable_models_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(EngineError, match="cannot unpack the starter model into"):
        starter_path(blocker / "models")
    assert os.listdir(tmp_path) == ["file"]


def test_an_imported_model_named_anything_still_shows_its_quantisation(tiny_model, tmp_path):
    from tui_chat.hub.local import import_model, list_local

    renamed = tmp_path / "my-model.gguf"
    renamed.write_bytes(tiny_model.read_bytes())
    models = tmp_path / "models"
    import_model(models, renamed)
    [local] = list_local(models)
    assert local.quant == "F16", "from the file's metadata: its name does not say"
