"""Hub search, listing and resumable downloads against the fake hub on 127.0.0.1; local models on disk."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from fake_hub import FILE, REPO, FakeFile
from tui_chat.engine.base import EngineError
from tui_chat.engine.factory import model_file
from tui_chat.hub import HubError, HubInputError
from tui_chat.hub.catalog import list_gguf, pull, search
from tui_chat.hub.download import Cancelled, part_path
from tui_chat.hub.http import OFFLINE_MESSAGE
from tui_chat.hub.local import find_local, hub_path, import_model, list_local, mark_used, remove_model
from tui_chat.hub.names import ModelRef, check_file_name, check_repo_id, parse_ref, quant_of, split_part


@pytest.fixture
def tiny_bytes(tiny_model: Path) -> bytes:
    return tiny_model.read_bytes()


@pytest.fixture
def hub(fake_hub, tiny_bytes):
    files = {FILE: tiny_bytes, "tiny-Q8_0.gguf": tiny_bytes[::-1], "README.md": FakeFile(b"# tiny", lfs=False)}
    fake_hub.add_repo(REPO, files, downloads=900, likes=3)
    return fake_hub


def pull_quietly(ref, models: Path, cancel: threading.Event | None = None):
    seen = []
    chosen, path = pull(ref, models, seen.append, cancel)
    return chosen, path, seen


# --- names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "quant"), [
    ("gemma-3-270m-it-Q4_K_M.gguf", "Q4_K_M"),
    ("qwen2.5-1.5b-instruct-q8_0.gguf", "Q8_0"),
    ("Llama-3.2-1B-Instruct-IQ3_XXS.gguf", "IQ3_XXS"),
    ("model.F16.gguf", "F16"),
    ("UD-Q4_K_XL/Qwen3-UD-Q4_K_XL-00001-of-00002.gguf", "Q4_K_XL"),
    ("phi-3-mini-BF16.gguf", "BF16"),
    ("readme-notes.gguf", ""),
])
def test_quant_from_the_file_name(name, quant):
    assert quant_of(name) == quant


def test_names_that_could_leave_the_models_dir_are_refused():
    assert parse_ref("owner/repo:sub/model-Q4_K_M.gguf") == ModelRef("owner/repo", "sub/model-Q4_K_M.gguf")
    assert parse_ref("/home/me/model.gguf") is None and parse_ref("model.gguf") is None
    for name in ("../x.gguf", "/etc/x.gguf", "a//b.gguf", "a/../../b.gguf", "x\x1b[2J.gguf", "a\\..\\b.gguf", ""):
        with pytest.raises(HubInputError, match="not a usable file name"):
            check_file_name(name)
    with pytest.raises(HubInputError, match="not a hub repository name"):
        parse_ref("../etc:passwd.gguf")
    assert split_part("m-00002-of-00003.gguf").index == 2
    assert split_part("m-00004-of-00003.gguf") is None



def test_nul_backslashes_and_encoded_dots_cannot_leave_the_models_dir(tmp_path):
    for name in ("a\x00b.gguf", "sub\\..\\..\\x.gguf", "C:\\x.gguf", "/abs.gguf", "a/./b.gguf", "..", "x/.."):
        with pytest.raises(HubInputError, match="not a usable file name"):
            check_file_name(name)
    for repo in ("../x", "./x", "a/..", "own\\er/x", "/etc/x", "a\x00/b", "%2e%2e/x", "a/b/c"):
        with pytest.raises(HubInputError, match="not a hub repository name"):
            check_repo_id(repo)
    ref = parse_ref("owner/repo:%2e%2e/%2e%2e/model.gguf")  # a literal folder name here, never decoded
    assert hub_path(tmp_path, ref) == tmp_path / "hub" / "owner" / "repo" / "%2e%2e" / "%2e%2e" / "model.gguf"
    from huggingface_hub import hf_hub_url

    assert "/%252e%252e/%252e%252e/model.gguf" in hf_hub_url(ref.repo, ref.file, endpoint="http://127.0.0.1:9")

# --- search and listing --------------------------------------------------------------------------


def test_search_finds_gguf_repos_sorted_by_downloads_or_likes(hub, tiny_bytes):
    hub.add_repo("other/tiny-liked-GGUF", {"m-Q8_0.gguf": tiny_bytes}, downloads=10, likes=50)
    hub.add_repo("other/tiny-safetensors", {"model.safetensors": b"x"}, downloads=10_000)
    assert [r.repo for r in search("TINY")] == [REPO, "other/tiny-liked-GGUF"]
    assert [r.repo for r in search("tiny", sort="likes")] == ["other/tiny-liked-GGUF", REPO]
    assert search("tiny")[0].downloads == 900
    asked = hub.requests("/api/models")[0].query
    assert asked["filter"] == ["gguf"] and asked["search"] == ["TINY"] and asked["sort"] == ["downloads"]
    with pytest.raises(HubInputError, match="sort must be one of downloads, likes"):
        search("tiny", sort="stars")


def test_listing_groups_split_sets_follows_pages_and_reads_sizes(fake_hub, tiny_bytes):
    fake_hub.page_size = 2
    fake_hub.add_repo("org/split-GGUF", {
        "Q8_0/big-Q8_0-00001-of-00003.gguf": tiny_bytes[:1000],
        "Q8_0/big-Q8_0-00002-of-00003.gguf": tiny_bytes[1000:3000],
        "Q8_0/big-Q8_0-00003-of-00003.gguf": tiny_bytes[3000:],
        "small-Q2_K.gguf": tiny_bytes[:10],
        "config.json": b"{}",
    })
    listing = list_gguf("org/split-GGUF")
    assert len(fake_hub.requests("/tree/")) == 3, "every page of the tree is read"
    split, small = listing.models
    assert split.name == "Q8_0/big-Q8_0-00001-of-00003.gguf" and len(split.parts) == 3
    assert split.size == len(tiny_bytes) and split.quant == "Q8_0" and split.complete
    assert small.quant == "Q2_K" and small.size == 10
    assert listing.choose("Q8_0/big-Q8_0-00002-of-00003.gguf") is split
    with pytest.raises(HubInputError, match="has 2 GGUF models: name one"):
        listing.choose(None)


def test_a_repo_without_gguf_files_is_a_clear_error(fake_hub):
    fake_hub.add_repo("org/safetensors-only", {"model.safetensors": b"x" * 10})
    with pytest.raises(HubInputError, match="org/safetensors-only has no GGUF files"):
        list_gguf("org/safetensors-only")


# --- downloads -----------------------------------------------------------------------------------


def test_pull_reports_progress_and_names_the_verified_file(hub, models, tiny_bytes, monkeypatch):
    chosen, path, seen = pull_quietly(f"{REPO}", models)
    assert chosen == ModelRef(REPO, FILE)
    assert path == models / "hub" / "tiny-org" / "tiny-GGUF" / FILE and path.read_bytes() == tiny_bytes
    assert seen[-1].done == seen[-1].total == len(tiny_bytes)
    assert [p.done for p in seen] == sorted(p.done for p in seen)
    assert not part_path(path).exists()
    commit = hub.repos[REPO].commit
    assert [r.path for r in hub.requests("/resolve/")] == [f"/{REPO}/resolve/{commit}/{FILE}"]
    assert model_file(str(chosen), None, models) == path
    asked = len(hub.seen)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert pull_quietly(str(chosen), models)[1] == path
    assert len(hub.seen) == asked, "a model already here is not asked for again, even offline"


def test_a_cut_connection_resumes_with_range(hub, models, tiny_bytes):
    hub.faults.cut_after[FILE] = [100_000, 50_000]
    _, path, _ = pull_quietly(f"{REPO}:{FILE}", models)
    assert path.read_bytes() == tiny_bytes
    first, *resumed = [r.headers.get("Range") for r in hub.requests("/cdn/")]
    offsets = [int(r.removeprefix("bytes=").removesuffix("-")) for r in resumed]
    assert first is None and len(offsets) == 2, "each cut is resumed, not restarted"
    assert 0 < offsets[0] < offsets[1] <= 150_000


def test_a_server_ignoring_range_gets_the_whole_file_again(hub, models, tiny_bytes):
    hub.faults.cut_after[FILE] = [100_000]
    hub.faults.ignore_range = True
    _, path, seen = pull_quietly(f"{REPO}:{FILE}", models)
    assert path.read_bytes() == tiny_bytes
    assert seen[-1].done == len(tiny_bytes)


def test_cancel_keeps_the_part_and_the_next_pull_resumes(hub, models, tiny_bytes):
    hub.faults.stall_after[FILE] = 150_000
    cancel = threading.Event()
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(_try(pull_quietly, f"{REPO}:{FILE}", models, cancel)))
    worker.start()
    part = part_path(models / "hub" / "tiny-org" / "tiny-GGUF" / FILE)
    _wait(lambda: part.exists() and part.stat().st_size == 150_000)
    cancel.set()
    hub.faults.release.set()
    worker.join(10)
    assert isinstance(outcome[0], Cancelled) and "pull again to resume" in str(outcome[0])
    assert part.stat().st_size == 150_000 and not (models / "hub" / "tiny-org" / "tiny-GGUF" / FILE).exists()
    del hub.faults.stall_after[FILE]
    _, path, _ = pull_quietly(f"{REPO}:{FILE}", models)
    assert path.read_bytes() == tiny_bytes
    assert hub.requests("/cdn/")[-1].headers.get("Range") == "bytes=150000-"


def test_a_checksum_mismatch_is_rejected_and_nothing_is_kept(hub, models):
    hub.faults.wrong_content.add(FILE)
    with pytest.raises(HubError, match="does not match the hub's sha256"):
        pull_quietly(f"{REPO}:{FILE}", models)
    folder = models / "hub" / "tiny-org" / "tiny-GGUF"
    assert sorted(p.name for p in folder.iterdir()) == []
    with pytest.raises(EngineError, match=f"is not downloaded: get it with tui-chat models pull {REPO}:{FILE}"):
        model_file(f"{REPO}:{FILE}", None, models)


def test_small_files_are_checked_by_their_git_hash(fake_hub, models):
    fake_hub.add_repo("org/plain", {"m-Q4_0.gguf": FakeFile(b"GGUF" + bytes(60), lfs=False)})
    _, path, _ = pull_quietly("org/plain", models)
    assert path.read_bytes() == b"GGUF" + bytes(60)
    fake_hub.faults.wrong_content.add("m-Q4_0.gguf")
    path.unlink()
    with pytest.raises(HubError, match="does not match the hub's git-sha1"):
        pull_quietly("org/plain", models)


def test_split_models_download_as_one_set(fake_hub, models, tiny_bytes):
    fake_hub.add_repo("org/split-GGUF", {
        "big-Q8_0-00001-of-00002.gguf": tiny_bytes[:200_000],
        "big-Q8_0-00002-of-00002.gguf": tiny_bytes[200_000:],
    })
    chosen, path, seen = pull_quietly("org/split-GGUF:big-Q8_0-00002-of-00002.gguf", models)
    assert chosen.file == "big-Q8_0-00001-of-00002.gguf" and path.name == chosen.file
    assert path.read_bytes() + path.with_name("big-Q8_0-00002-of-00002.gguf").read_bytes() == tiny_bytes
    assert seen[-1].done == seen[-1].total == len(tiny_bytes)
    [local] = list_local(models)
    assert local.name == str(chosen) and local.size == len(tiny_bytes) and len(local.files) == 2
    path.with_name("big-Q8_0-00002-of-00002.gguf").unlink()
    assert list_local(models) == [], "a set with a part missing is not offered"
    with pytest.raises(EngineError, match="is not downloaded"):
        model_file(str(chosen), None, models)


# --- failures ------------------------------------------------------------------------------------


def test_missing_private_and_gated_repos_say_what_to_do(fake_hub, tiny_bytes, monkeypatch, models):
    fake_hub.add_repo("org/private-GGUF", {FILE: tiny_bytes}, private=True)
    fake_hub.add_repo("org/gated-GGUF", {FILE: tiny_bytes}, gated=True)
    with pytest.raises(HubInputError, match=r"repository no/such: not found on the hub \(404\)"):
        list_gguf("no/such")
    with pytest.raises(HubInputError, match=r"not logged in \(401\): set HF_TOKEN or run hf auth login"):
        list_gguf("org/private-GGUF")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(HubInputError, match=r"refused your token \(401\)"):
        list_gguf("org/private-GGUF")
    with pytest.raises(HubInputError, match=r"access denied \(403\): if the repo is gated, accept its terms"):
        list_gguf("org/gated-GGUF")
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    _, path, _ = pull_quietly("org/gated-GGUF", models)
    assert path.read_bytes() == tiny_bytes
    assert all(r.headers.get("Authorization") == "Bearer hf_test_token" for r in fake_hub.requests("/cdn/"))


def test_a_hub_answering_garbage_or_failing_is_one_line(hub):
    hub.faults.garbage = True
    with pytest.raises(HubError, match="search: the hub sent an answer that is not JSON"):
        search("tiny")
    with pytest.raises(HubError, match=f"repository {REPO}: the hub at .* sent an answer tui-chat cannot read"):
        list_gguf(REPO)
    hub.faults.garbage = False
    hub.faults.status = 503
    with pytest.raises(HubError, match="the hub answered with HTTP 503"):
        search("tiny")


def test_unsafe_names_in_a_listing_are_refused(fake_hub, models):
    fake_hub.add_repo("org/evil-GGUF", {"../../escape.gguf": b"GGUF"})
    with pytest.raises(HubError, match="listed a file name tui-chat will not write: '../../escape.gguf'"):
        pull_quietly("org/evil-GGUF", models)
    assert not (models.parent / "escape.gguf").exists()


def test_offline_answers_at_once_without_asking(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(HubError, match=re.escape(OFFLINE_MESSAGE)):
        search("tiny")
    assert time.monotonic() - start < 0.5 and hub.seen == []


def test_an_unreachable_hub_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(HubError, match=r"search: cannot reach the hub at http://127.0.0.1:9 .*offline\?"):
        search("tiny")


# --- local models --------------------------------------------------------------------------------


def test_local_models_list_import_use_and_remove(hub, models, tiny_model, tmp_path):
    chosen, path, _ = pull_quietly(REPO, models)
    imported = import_model(models, tiny_model)
    assert imported.name == "tiny.gguf" and imported.path.read_bytes() == tiny_model.read_bytes()
    assert model_file("tiny.gguf", None, models) == imported.path
    with pytest.raises(HubInputError, match="already in"):
        import_model(models, tiny_model)
    notes = tmp_path / "notes.gguf"
    notes.write_text("not a model")
    with pytest.raises(HubInputError, match="is not a GGUF model file"):
        import_model(models, notes)
    mark_used(models, path)
    assert [m.name for m in list_local(models)] == [str(chosen), "tiny.gguf"]
    assert list_local(models)[0].last_used is not None and list_local(models)[0].quant == "Q4_K_M"
    assert json.loads((models / "models.json").read_text())[f"hub/{REPO}/{FILE}"]["commit"] == hub.repos[REPO].commit
    removed = remove_model(models, str(chosen))
    assert removed.path == path and not path.exists() and not (models / "hub").exists()
    assert find_local(models, str(chosen)) is None
    with pytest.raises(HubInputError, match="no local model named 'gone.gguf'"):
        remove_model(models, "gone.gguf")


def _try(function, *args):
    try:
        return function(*args)
    except HubError as error:
        return error


def _wait(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
