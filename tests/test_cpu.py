"""Threads that fit the machine and its load, and the CPU path that does not crash: fake topologies,
a fake /proc/stat, probes that crash on purpose in real child processes, and the real self-test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import llama_cpp
import pytest

from conftest import GREEDY, ask, open_backend, run_cli
from tui_chat.engine.base import Message, Request
from tui_chat.engine.local.cpu import (
    FAST_STEP_MS,
    LoadWatch,
    ThreadGovernor,
    Threads,
    Topology,
    choose_threads,
    read_topology,
)
from tui_chat.engine.local.cpu_path import CpuPath, ProbeResult, choose, known, result_of, run_probe
from tui_chat.engine.params import LiveParams
from tui_chat.gguf import read_header

AMX_BUILD = {"AVX2", "AVX512", "AMX_INT8", "REPACK"}
PLAIN_BUILD = {"AVX2", "REPACK"}


def fake_sysfs(root: Path, cores: dict[int, tuple[int, int]], atom: str = "", cpu_max: str = "") -> Path:
    """cpu number -> (package, core), as /sys/devices/system/cpu/cpuN/topology shows them."""
    for cpu, (package, core) in cores.items():
        topology = root / f"devices/system/cpu/cpu{cpu}/topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    if atom:
        (root / "devices/cpu_atom").mkdir(parents=True)
        (root / "devices/cpu_atom/cpus").write_text(atom + "\n")
    if cpu_max:
        (root / "fs/cgroup").mkdir(parents=True)
        (root / "fs/cgroup/cpu.max").write_text(cpu_max + "\n")
    return root


def smt(cores: int, packages: int = 1) -> dict[int, tuple[int, int]]:
    """Two hyper-threads per core, numbered as Linux does: siblings are N and N + cores."""
    per_package = cores // packages
    first = {cpu: (cpu // per_package, cpu % per_package) for cpu in range(cores)}
    return first | {cpu + cores: core for cpu, core in first.items()}


MACHINES = {
    "1 CPU": ({0: (0, 0)}, "", "", Topology(1, 1, 1), Threads(1, 1)),
    "2 CPUs": ({0: (0, 0), 1: (0, 1)}, "", "", Topology(2, 2, 2), Threads(2, 2)),
    "8 CPUs, 4 cores": (smt(4), "", "", Topology(8, 4, 4), Threads(4, 4)),
    "64 CPUs, 2 sockets": (smt(32, packages=2), "", "", Topology(64, 32, 32), Threads(32, 32)),
    "hybrid 8P+8E": (smt(8) | {16 + i: (0, 8 + i) for i in range(8)}, "16-23", "", Topology(24, 16, 8), Threads(8, 16)),
    "64 CPUs, cgroup of 2": (smt(32), "", "200000 100000", Topology(64, 32, 32, 2.0), Threads(2, 2)),
}


@pytest.mark.parametrize("machine", MACHINES.values(), ids=MACHINES.keys())
def test_threads_are_the_physical_math_cores(tmp_path, machine):
    cores, atom, cpu_max, topology, threads = machine
    root = fake_sysfs(tmp_path, cores, atom, cpu_max)
    assert read_topology(set(cores), root) == topology
    assert choose_threads(topology) == threads


@pytest.mark.parametrize(("topology", "busy", "decode"), [
    (Topology(2, 2, 2), 1.0, 1),  # the measured collapse: never 2 threads beside a busy core
    (Topology(2, 2, 2), 0.67, 1),  # a busy process squeezed by our own spinning threads
    (Topology(2, 2, 2), 0.2, 2),  # a light background job leaves the core to us
    (Topology(2, 2, 2), 5.0, 1),  # an overloaded machine still gets one thread
    (Topology(8, 4, 4), 4.0, 4),  # four busy hyper-threads leave every core a free sibling
    (Topology(8, 4, 4), 6.0, 2),
    (Topology(1, 1, 1), 1.0, 1),
])
def test_threads_give_way_to_other_processes(topology, busy, decode):
    assert choose_threads(topology, busy).decode == decode


def write_stat(path: Path, ticks: dict[int, int]) -> None:
    """/proc/stat with each CPU's user ticks as given (everything else idle)."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{cpu} {user} 0 0 1000000 0 0 0 0 0 0" for cpu, user in ticks.items()]
    path.write_text("\n".join(lines) + "\n")


def test_load_watch_counts_other_processes_on_our_cpus(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    clock = [100.0]
    monkeypatch.setattr("tui_chat.engine.local.cpu.time.monotonic", lambda: clock[0])
    monkeypatch.setattr("tui_chat.engine.local.cpu._TICKS_PER_S", 100)
    write_stat(stat, {0: 0, 1: 0, 2: 0})
    watch = LoadWatch({0, 1}, stat)
    clock[0] += 0.05
    assert watch.busy_elsewhere() is None  # too short a look: the window keeps growing
    clock[0] += 0.95
    write_stat(stat, {0: 100, 1: 50, 2: 100})  # one CPU's worth on cpu0 + half on cpu1; cpu2 is not ours
    busy = watch.busy_elsewhere()
    assert busy == pytest.approx(1.5, abs=0.05)


def test_governor_keeps_fixed_counts_and_follows_the_load_otherwise():
    class Watch:
        busy = 0.0

        def busy_elsewhere(self):
            return self.busy

    assert ThreadGovernor(3, 5, Topology(2, 2, 2)).threads == Threads(3, 5)
    assert ThreadGovernor(3, 5, Topology(2, 2, 2)).watch is None  # nothing to follow
    watch = Watch()
    governor = ThreadGovernor(topology=Topology(2, 2, 2), watch=watch)
    assert governor.threads == Threads(2, 2)
    watch.busy = 1.0
    assert governor.retune(now=1.0) and governor.threads == Threads(1, 1)
    watch.busy = 0.0
    assert not governor.retune(now=1.1)  # looked at most every CHECK_EVERY_S
    assert governor.retune(now=2.0) and governor.threads == Threads(2, 2)
    pinned = ThreadGovernor(decode=1, topology=Topology(2, 2, 2), watch=watch)
    watch.busy = 2.0
    pinned.retune(now=5.0)
    assert pinned.threads == Threads(1, 1)


def test_a_gpu_quick_step_keeps_a_core_for_the_apps_own_threads():
    """Issue 45: at ~1.4 ms a token (the GPU-regime proxy) the app's threads wake as often as llama.cpp's barrier
    and stall its spinning threads: a core is kept for them. At the starter's ~20 ms, every core decodes."""
    class Idle:
        def busy_elsewhere(self):
            return 0.0

    governor = ThreadGovernor(topology=Topology(2, 2, 2), watch=Idle())
    assert governor.retune(now=1.0, step_ms=1.4) and governor.threads == Threads(1, 1)
    assert governor.retune(now=2.0, step_ms=20.0) and governor.threads == Threads(2, 2)
    assert not governor.retune(now=3.0, step_ms=None)  # not measured yet: as the load says
    many = ThreadGovernor(topology=Topology(16, 16, 16), watch=Idle())
    assert many.retune(now=1.0, step_ms=1.0) and many.threads == Threads(15, 15)


# --- the CPU path -----------------------------------------------------------------------------

def child_probe(outcomes: dict[str, str], calls: list[str]):
    """A probe whose child process really runs: `crash` kills itself with SIGSEGV, `ok` exits 0."""

    def probe(_model: Path, path_name: str) -> ProbeResult:
        calls.append(path_name)
        code = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)" if outcomes[path_name] == "crash" else "pass"
        return result_of(subprocess.run([sys.executable, "-c", code], check=False).returncode)

    return probe


def weights(model: Path) -> frozenset[int]:
    """The tensor types a load reads from the model's header and gives the CPU path's choice."""
    return read_header(model).tensor_types


@pytest.fixture
def amx_model(tiny_model):
    """The tiny model's F16 weights are a kind llama.cpp's AMX buffer takes (as are Q4_K, Q6_K, Q8_0...)."""
    return tiny_model


@pytest.fixture
def f32_model(tmp_path):
    """Weights the AMX buffer never takes: only reading the tensor list matters here."""
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "f32.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_crashing_amx_probe_falls_back_and_is_remembered(tmp_path, amx_model):
    calls: list[str] = []
    probe = child_probe({"all": "crash", "no-amx": "ok"}, calls)
    path = choose("auto", amx_model, weights(amx_model), tmp_path, AMX_BUILD, probe, cpu_identity="Xeon with AMX")
    assert (path.name, calls) == ("no-amx", ["all", "no-amx"])
    assert path.describe() == "AVX-512 · AMX off (self-test crashed)"
    again = choose("auto", amx_model, weights(amx_model), tmp_path, AMX_BUILD, child_probe({}, calls),
                   cpu_identity="Xeon with AMX")
    assert again == path and calls == ["all", "no-amx"]  # remembered: no second probe
    other_cpu = choose("auto", amx_model, weights(amx_model), tmp_path, AMX_BUILD, child_probe({"all": "ok"}, calls),
                       cpu_identity="another CPU")
    assert other_cpu.name == "all" and calls[-1] == "all"


def test_when_repacking_crashes_too_the_extra_buffers_go(tmp_path, amx_model):
    calls: list[str] = []
    path = choose("auto", amx_model, weights(amx_model), tmp_path, AMX_BUILD,
                  child_probe({"all": "crash", "no-amx": "crash"}, calls), cpu_identity="x")
    assert path.name == "none" and not path.extra_buffers and calls == ["all", "no-amx"]
    assert path.describe() == "AVX-512 · AMX off (self-test crashed) · no repacking"
    assert known("auto", tmp_path, AMX_BUILD) != ""


def test_a_probe_that_does_not_finish_is_not_remembered(tmp_path, amx_model):
    calls: list[str] = []

    def hung(_model, name):
        calls.append(name)
        return ProbeResult(ok=False)

    assert choose("auto", amx_model, weights(amx_model), tmp_path, AMX_BUILD, hung, cpu_identity="x").name == "none"
    assert choose("auto", amx_model, weights(amx_model), tmp_path, AMX_BUILD, hung, cpu_identity="x").name == "none"
    assert calls == ["all", "all"]


def test_no_probe_without_amx_or_without_weights_that_meet_it(tmp_path, amx_model, f32_model):
    def never(*_args):
        raise AssertionError("probed")

    assert choose("auto", amx_model, weights(amx_model), tmp_path, PLAIN_BUILD, never) == CpuPath("all", False, "AVX2")
    f32_only = choose("auto", f32_model, weights(f32_model), tmp_path, AMX_BUILD, never, cpu_identity="x")
    assert f32_only.name == "all" and "not checked" in f32_only.reason


@pytest.mark.parametrize("setting", ["all", "no-amx", "none"])
def test_the_config_forces_a_path_without_probing(tmp_path, amx_model, setting):
    def never(*_args):
        raise AssertionError("probed")

    path = choose(setting, amx_model, weights(amx_model), tmp_path, AMX_BUILD, never)
    assert path.name == setting and path.extra_buffers == (setting != "none")


def test_a_damaged_cache_file_means_asking_again(tmp_path, amx_model):
    (tmp_path / "cpu-path.json").write_text("{not json")
    calls: list[str] = []
    path = choose("auto", amx_model, weights(amx_model), tmp_path, AMX_BUILD, child_probe({"all": "ok"}, calls),
                  cpu_identity="x")
    assert path.name == "all" and calls == ["all"]


STARTER_WEIGHTS = frozenset({0, 12, 14})  # F32, Q4_K, Q6_K: the starter's tensor types


def test_a_verdict_holds_only_for_the_weights_it_was_tested_on(tmp_path, amx_model):
    """Issue 44: a tiny F16 model passed AMX's self-test, the verdict was kept for the machine, and the starter's
    Q4_K weights then died of SIGILL at every start. Each kind of weights is tested for itself."""
    calls: list[str] = []
    tiny = choose("auto", amx_model, weights(amx_model), tmp_path, AMX_BUILD, child_probe({"all": "ok"}, calls),
                  cpu_identity="x")
    assert tiny.name == "all" and calls == ["all"]
    starter = choose("auto", amx_model, STARTER_WEIGHTS, tmp_path, AMX_BUILD,
                     child_probe({"all": "crash", "no-amx": "ok"}, calls), cpu_identity="x")
    assert (starter.name, starter.reason, calls) == ("no-amx", "self-test crashed", ["all", "all", "no-amx"])
    for model_weights, verdict in ((weights(amx_model), "all"), (STARTER_WEIGHTS, "no-amx")):
        again = choose("auto", amx_model, model_weights, tmp_path, AMX_BUILD, child_probe({}, calls), cpu_identity="x")
        assert again.name == verdict  # each remembered: no probe (an empty table would fail one)


def test_an_older_cache_that_held_one_verdict_per_machine_is_asked_again(tmp_path, amx_model):
    choose("auto", amx_model, weights(amx_model), tmp_path, AMX_BUILD, child_probe({"all": "ok"}, []), cpu_identity="x")
    machine = next(iter(json.loads((tmp_path / "cpu-path.json").read_text())))
    (tmp_path / "cpu-path.json").write_text(json.dumps({machine: ["all", ""]}))
    calls: list[str] = []
    path = choose("auto", amx_model, STARTER_WEIGHTS, tmp_path, AMX_BUILD, child_probe({"all": "crash", "no-amx": "ok"},
                  calls), cpu_identity="x")
    assert path.name == "no-amx" and calls == ["all", "no-amx"]


DIE_ON_TRIAL = """
import os, signal, sys
from pathlib import Path
from tui_chat.engine.local.cpu_path import CpuPath, on_trial
path = CpuPath("all", True, "AVX-512", trial=sys.argv[1])
with on_trial(path, Path(sys.argv[2])):
    if sys.argv[3] == "die":
        os.kill(os.getpid(), signal.SIGILL)
"""


def test_a_load_that_dies_on_amx_makes_the_next_one_take_the_safe_path(tmp_path, amx_model):
    """The self-test passed but a real load died (a batch size the test did not meet): the trial left behind
    sends the next load down the ladder's other paths, and the verdict says why."""
    calls: list[str] = []
    first = choose("auto", amx_model, STARTER_WEIGHTS, tmp_path, AMX_BUILD, child_probe({"all": "ok"}, calls),
                   cpu_identity="x")
    assert first.uses_amx and first.trial
    survived = subprocess.run([sys.executable, "-c", DIE_ON_TRIAL, first.trial, str(tmp_path), "live"], check=False)
    assert survived.returncode == 0
    again = choose("auto", amx_model, STARTER_WEIGHTS, tmp_path, AMX_BUILD, child_probe({}, calls), cpu_identity="x")
    assert again.name == "all" and calls == ["all"]  # a load that came through ends its trial
    died = subprocess.run([sys.executable, "-c", DIE_ON_TRIAL, first.trial, str(tmp_path), "die"], check=False)
    assert died.returncode == -signal.SIGILL
    safe = choose("auto", amx_model, STARTER_WEIGHTS, tmp_path, AMX_BUILD, child_probe({"no-amx": "ok"}, calls),
                  cpu_identity="x")
    assert (safe.name, safe.reason, safe.trial, calls) == ("no-amx", "crashed loading", "", ["all", "no-amx"])
    assert safe.describe() == "AVX-512 · AMX off (crashed loading)"
    kept = choose("auto", amx_model, STARTER_WEIGHTS, tmp_path, AMX_BUILD, child_probe({}, calls), cpu_identity="x")
    assert kept.name == "no-amx" and calls == ["all", "no-amx"]  # remembered, and the old trial is gone


def test_info_names_each_kind_of_weights_tested(tmp_path, amx_model, monkeypatch):
    monkeypatch.setattr("tui_chat.engine.local.cpu_path._cpu_identity", lambda: "x")
    choose("auto", amx_model, weights(amx_model), tmp_path, AMX_BUILD, child_probe({"all": "ok"}, []))
    choose("auto", amx_model, STARTER_WEIGHTS, tmp_path, AMX_BUILD, child_probe({"all": "crash", "no-amx": "ok"}, []))
    assert known("auto", tmp_path, AMX_BUILD) == (
        "all for F16 weights (AMX passed its self-test); no-amx for Q4_K/Q6_K weights (AMX self-test crashed)")


@pytest.mark.starter
def test_a_small_models_verdict_then_the_starter_answers(tiny_model, tmp_path):
    """Issue 44's steps with a fresh cache: the tiny model first, then the starter, as real processes. On an AMX
    CPU the second died of SIGILL; here it answers on every CPU kind."""
    env = os.environ | {"XDG_CACHE_HOME": str(tmp_path / "fresh-cache")}
    tiny = run_cli("run", "--model", str(tiny_model), "-p", "hello", "--max-tokens", "8", env=env)
    assert tiny.returncode == 0, tiny.stderr
    starter = run_cli("run", "-p", "What is the capital of France?", "--temperature", "0", env=env)
    assert starter.returncode == 0, starter.stderr
    assert "Paris" in starter.stdout


@pytest.mark.parametrize("path_name", ["all", "no-amx", "none"])
def test_the_real_self_test_passes_on_every_path_here(tiny_model, path_name):
    assert run_probe(tiny_model, path_name) == ProbeResult(ok=True)


def test_the_real_self_test_reports_a_model_it_cannot_load(tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(20))
    assert not run_probe(broken, "all").conclusive


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="seccomp on x86-64 Linux")
def test_denying_amx_makes_the_kernel_refuse_it_to_every_thread():
    code = """
import ctypes, threading
from tui_chat.engine.local.cpu_path import deny_amx
libc = ctypes.CDLL(None, use_errno=True)
assert deny_amx()
results = []
def ask():
    results.append((libc.syscall(158, 0x1023, 18), ctypes.get_errno()))
worker = threading.Thread(target=ask); worker.start(); worker.join()
ask()
print(results)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[(-1, 1), (-1, 1)]"  # EPERM in a thread started later and in the caller


def test_cpu_path_is_said_in_the_model_info(tiny):
    assert tiny.info.cpu and tiny.info.offload == f"CPU {tiny.info.cpu}"
    assert tiny.info.threads >= 1


def test_a_reply_gives_threads_back_when_another_process_starts_mid_reply(tiny_model, monkeypatch):
    """The engine looks at the load between tokens: llama.cpp's own context ends with the new count."""

    class Watch:
        calls = 0

        def busy_elsewhere(self):
            self.calls += 1
            return 0.0 if self.calls < 3 else 1.0  # quiet at first, then a build starts

    monkeypatch.setattr("tui_chat.engine.local.cpu.CHECK_EVERY_S", 0.0)
    backend = open_backend(tiny_model, n_ctx=4096)
    try:
        backend.threads = ThreadGovernor(topology=Topology(2, 2, 2), watch=Watch())
        request = Request([Message("user", "Hello")], LiveParams(GREEDY.with_changes(max_tokens=200)))
        done = backend.generate(request).result()
        assert done.metrics.threads == 1
        assert llama_cpp.llama_n_threads(backend.session.ctx) == 1
    finally:
        backend.close()


def test_a_fast_models_first_prompt_is_read_with_a_core_kept_for_the_app(tiny_model):
    """Issue 45: the load times one step, so a model in the GPU's regime keeps a core for the app's UI from its
    first reply on. Before, that reply read its prompt on every core, and the UI drawing the sent message beside
    it stalled llama.cpp's barrier: ~100 ms on a 20 ms read (the GPU-regime proxy, AMD EPYC, 2 cores)."""
    class Idle:
        def busy_elsewhere(self):
            return 0.0

    backend = open_backend(tiny_model, n_ctx=1024)
    try:
        assert 0 < backend.session.step_ms_at_load < FAST_STEP_MS
        backend.threads = ThreadGovernor(topology=Topology(2, 2, 2), watch=Idle())
        backend.session.set_threads(backend.threads.threads)
        assert llama_cpp.llama_n_threads_batch(backend.session.ctx) == 2
        ask(backend, "Hello", GREEDY.with_changes(max_tokens=1))
        assert llama_cpp.llama_n_threads_batch(backend.session.ctx) == 1
    finally:
        backend.close()


def test_threads_set_by_flag_reach_llama_cpp(tiny_model):
    done = run_cli("run", "-m", str(tiny_model), "-p", "Hello", "--max-tokens", "4", "--threads", "1", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["turns"][0]["threads"] == 1


def test_the_main_thread_the_ui_runs_on_counts_as_load_on_the_machine():
    """The chat app's UI shares the cores with llama.cpp: its CPU time is not the engine's own."""
    watch = LoadWatch()
    end = time.monotonic() + 0.4
    while time.monotonic() < end:
        sum(range(1000))
    assert watch.busy_elsewhere() >= 0.6


def test_fixed_thread_counts_are_never_looked_at_again():
    """With --threads and --threads-batch the decode loop has nothing to retune: it must not call in every token."""
    governor = ThreadGovernor(2, 2, topology=Topology(logical=4, physical=4, performance=4))
    assert time.monotonic() < governor.next_check
    assert ThreadGovernor(None, None, topology=Topology(logical=4, physical=4, performance=4)).next_check == 0.0


def test_an_engine_process_counts_the_apps_ui_as_load_and_its_helper_threads_as_its_own():
    """In its own process the engine's governor reads the app's process: its main thread (the UI) shares the
    cores with llama.cpp; its other threads (the socket's reader, the bridge) are the engine's plumbing. The same
    burn seen from both (whatever else the machine runs meanwhile counts in both alike)."""
    import subprocess
    import sys

    def busy_with_a_burn(where: str) -> float:
        burn = "while True: sum(range(1000))"
        code = burn if where == "main" else (f"import threading\nthreading.Thread(target=lambda: exec({burn!r}))"
                                             ".start()\nimport time\ntime.sleep(60)")
        app = subprocess.Popen([sys.executable, "-c", code])
        try:
            time.sleep(0.3)
            watch = LoadWatch(ui_process=app.pid)
            time.sleep(0.6)
            busy = watch.busy_elsewhere()
        finally:
            app.kill()
            app.wait()
        assert busy is not None
        return busy

    assert busy_with_a_burn("main") - busy_with_a_burn("helper") > 0.6
