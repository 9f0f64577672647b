"""Which of llama.cpp's CPU weight layouts this machine can run, found out once, in a child process.

At load llama.cpp copies weights into "extra buffer types": CPU_REPACK (interleaved Q4_0/Q4_K/IQ4_NL
rows for AVX2/AVX-512/NEON) and, where the build and the CPU have Intel AMX, the AMX layout. On some
AMX machines (virtualised Sapphire and Granite Rapids) the AMX kernels crash the process on its first
decode (llama.cpp #20824, Ollama #17249, #17006). So before a model whose weights would meet those
kernels loads on such a machine, a child process loads it and decodes a few tokens: a crash there costs
nothing. The answer is kept per llama.cpp build, CPU and the weight types AMX would take: a verdict from a
model of F16 weights says nothing of Q4_K ones (a tiny F16 model passed on an AMX Xeon where the starter's
Q4_K weights then died of SIGILL at every start). The self-test reads a whole prompt batch and single tokens,
as a load's warm-up does, and a load on AMX runs inside a trial: if the process dies before the warm-up is
through, the next load finds the trial unfinished and takes the safe path. The ladder, fastest first:

  all     every extra buffer type (llama.cpp's default)
  no-amx  AMX denied to this process by the kernel (seccomp), so llama.cpp keeps CPU_REPACK
  none    no extra buffer types (`use_extra_bufts = False`), known to work where AMX crashes
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import struct
import sys
from collections.abc import Callable, Iterator, Sequence, Set
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

AUTO = "auto"
PATHS = ("all", "no-amx", "none")
CHOICES = (AUTO, *PATHS)
PROBE_TIMEOUT_S = 300.0
CACHE_FILE = "cpu-path.json"
TRIAL_FILE = "cpu-path-trial.json"
# ggml types the AMX buffer takes (amx/amx.cpp supports_op), by their names in ggml.h
AMX_TYPE_NAMES = {1: "F16", 2: "Q4_0", 3: "Q4_1", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 23: "IQ4_XS"}
AMX_TYPES = frozenset(AMX_TYPE_NAMES)
SIMD_NAMES = (("AVX512", "AVX-512"), ("AVX2", "AVX2"), ("AVX", "AVX"), ("SVE", "SVE"), ("NEON", "NEON"))

Probe = Callable[[Path, str], "ProbeResult"]


@dataclass(frozen=True, slots=True)
class ProbeResult:
    ok: bool
    crashed: str = ""  # the signal's name when the child died of one

    @property
    def conclusive(self) -> bool:
        return self.ok or bool(self.crashed)


@dataclass(frozen=True, slots=True)
class CpuPath:
    name: str  # one of PATHS
    amx: bool  # the build and the CPU have AMX
    simd: str  # the widest vector unit the build uses, e.g. "AVX-512"
    reason: str = ""  # why not the default: "self-test crashed", "set in the config"...
    trial: str = field(default="", compare=False)  # the verdict's key while AMX is on trial in a load (`on_trial`)

    @property
    def extra_buffers(self) -> bool:
        return self.name != "none"

    @property
    def uses_amx(self) -> bool:
        return self.amx and self.name == "all"

    def describe(self) -> str:
        """For the model info: `AVX-512 · AMX off (self-test crashed)`."""
        parts = [self.simd] if self.simd else []
        why = f" ({self.reason})" if self.reason else ""
        if self.amx:
            parts.append(f"AMX {'on' if self.name == 'all' else 'off'}{why}")
        if self.name == "none":
            parts.append(f"no repacking{'' if self.amx else why}")
        return " · ".join(parts)


def choose(setting: str, model: Path, tensor_types: Set[int], cache_dir: Path | None, features: set[str],
           probe: Probe | None = None, cpu_identity: str | None = None) -> CpuPath:
    """The path to load `model` with: forced by `setting`, remembered for this build, CPU and the weight types
    AMX would take, or probed (only where its weights, `tensor_types` from its header, would meet AMX)."""
    amx = "AMX_INT8" in features
    simd = next((name for flag, name in SIMD_NAMES if flag in features), "")
    if setting != AUTO:
        return CpuPath(setting, amx, simd, "configured" if setting != "all" else "")
    if not amx:
        return CpuPath("all", amx, simd)
    if not tensor_types & AMX_TYPES:
        return CpuPath("all", amx, simd, "not checked: this model's weights do not use AMX")
    machine = _cache_key(features, cpu_identity or _cpu_identity())
    weights = _weights_key(tensor_types)
    remembered = _remembered(cache_dir, machine).get(weights)
    if _trial_failed(cache_dir, machine, weights):  # AMX passed the self-test but killed a load: the rest is tried
        _end_trial(cache_dir, f"{machine}/{weights}")
        path = _probe_ladder(model, probe or run_probe, cache_dir, (machine, weights), PATHS[1:-1],
                             CpuPath("", amx, simd, "crashed loading"))
    elif remembered:
        path = CpuPath(remembered[0], amx, simd, remembered[1])
    else:
        path = _probe_ladder(model, probe or run_probe, cache_dir, (machine, weights), PATHS[:-1],
                             CpuPath("", amx, simd, "self-test crashed"))
    return replace(path, trial=f"{machine}/{weights}") if path.uses_amx else path


def known(setting: str, cache_dir: Path | None, features: set[str]) -> str:
    """What loads will use, as far as it is known without a model (for `tui-chat info`): a verdict per kind of
    weights tested so far."""
    if setting != AUTO:
        return f"{setting} (set in the config or by a flag)"
    if "AMX_INT8" not in features:
        return "all (no AMX in this build, nothing to test)"
    remembered = _remembered(cache_dir, _cache_key(features, _cpu_identity()))
    if not remembered:
        return "not tested yet: the first model whose weights use AMX is tested in a child process"
    return "; ".join(f"{name} for {weights.replace(',', '/')} weights" + (
        f" (AMX {reason})" if reason else " (AMX passed its self-test)")
        for weights, (name, reason) in sorted(remembered.items()))


@contextmanager
def on_trial(path: CpuPath, cache_dir: Path | None) -> Iterator[None]:
    """Around a load on AMX: if this process dies inside (llama.cpp's AMX kernels crash with SIGILL or SIGSEGV
    on some batch the self-test did not meet), the trial stays on disk and the next `choose` takes the safe
    path. A load that fails cleanly (an error, not a death) ends the trial too."""
    if not path.trial or cache_dir is None:
        yield
        return
    trials = _read_json(cache_dir / TRIAL_FILE) | {path.trial: os.getpid()}
    _write_json(cache_dir, TRIAL_FILE, trials)
    try:
        yield
    finally:
        _end_trial(cache_dir, path.trial)


def _end_trial(cache_dir: Path | None, key: str) -> None:
    if cache_dir is not None:
        rest = {other: pid for other, pid in _read_json(cache_dir / TRIAL_FILE).items() if other != key}
        _write_json(cache_dir, TRIAL_FILE, rest)


def _trial_failed(cache_dir: Path | None, machine: str, weights: str) -> bool:
    """A trial of these weights was left behind by a process that is gone: it died loading them on AMX."""
    if cache_dir is None:
        return False
    pid = _read_json(cache_dir / TRIAL_FILE).get(f"{machine}/{weights}")
    return isinstance(pid, int) and pid != os.getpid() and not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: alive
    return True


def _weights_key(tensor_types: Set[int]) -> str:
    """The weight types AMX would take, by name: what a verdict holds for ("Q4_K,Q6_K")."""
    return ",".join(AMX_TYPE_NAMES[kind] for kind in sorted(tensor_types & AMX_TYPES))


def _probe_ladder(model: Path, probe: Probe, cache_dir: Path | None, key: tuple[str, str], names: Sequence[str],
                  crashed: CpuPath) -> CpuPath:
    """The first of `names` whose self-test passes, remembered; `crashed` carries the machine's facts and the
    reason a path below the default gives."""
    for name in names:
        result = probe(model, name)
        if result.ok:
            reason = "" if name == "all" else crashed.reason
            return _remember(cache_dir, *key, replace(crashed, name=name, reason=reason))
        if not result.conclusive:
            return replace(crashed, name="none", reason="self-test hung")
    return _remember(cache_dir, *key, replace(crashed, name="none"))


def run_probe(model: Path, path_name: str, timeout_s: float = PROBE_TIMEOUT_S) -> ProbeResult:
    """Load `model` on `path_name` in a child process and decode a few tokens."""
    import subprocess  # here: the config imports this module for its names, at every start

    command = [sys.executable, "-m", "tui_chat.engine.local.probe", path_name, os.fspath(model)]
    try:
        child = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ProbeResult(ok=False)
    return result_of(child.returncode)


def result_of(returncode: int) -> ProbeResult:
    if returncode == 0:
        return ProbeResult(ok=True)
    if returncode < 0:
        import signal

        try:
            return ProbeResult(ok=False, crashed=signal.Signals(-returncode).name)
        except ValueError:
            return ProbeResult(ok=False, crashed=f"signal {-returncode}")
    return ProbeResult(ok=False)


def _cpu_identity() -> str:
    """The CPU's model and feature flags: a different CPU (a migrated VM too) is asked again."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags")
    return "\n".join(dict.fromkeys(line for line in lines if line.split(":")[0].strip() in wanted))


def _cache_key(features: set[str], cpu_identity: str) -> str:
    import llama_cpp

    library = Path(llama_cpp.__file__).parent / "lib"
    stamps = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in library.glob("*") if p.is_file())
    text = json.dumps([llama_cpp.__version__, sorted(features), stamps, cpu_identity])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _remembered(cache_dir: Path | None, machine: str) -> dict[str, tuple[str, str]]:
    """This build and CPU's verdicts, by the weight types each was tested on (an older file's one verdict per
    machine, which held for every model, is not read: it is asked again)."""
    entry = _read_json(cache_dir / CACHE_FILE).get(machine) if cache_dir else _MEMORY.get(machine)
    if not isinstance(entry, dict):
        return {}
    return {weights: (verdict[0], verdict[1]) for weights, verdict in entry.items()
            if isinstance(verdict, list) and len(verdict) == 2 and verdict[0] in PATHS and isinstance(verdict[1], str)}


def _remember(cache_dir: Path | None, machine: str, weights: str, path: CpuPath) -> CpuPath:
    verdict = [path.name, path.reason]
    _MEMORY.setdefault(machine, {})[weights] = verdict
    if cache_dir is not None:
        entries = _read_json(cache_dir / CACHE_FILE)
        known_here = entries.get(machine)
        entries[machine] = (known_here if isinstance(known_here, dict) else {}) | {weights: verdict}
        _write_json(cache_dir, CACHE_FILE, entries)
    return path


def _read_json(path: Path) -> dict[str, Any]:
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _write_json(cache_dir: Path, name: str, entries: dict[str, Any]) -> None:
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = cache_dir / f"{name}.{os.getpid()}.partial"
        partial.write_text(json.dumps(entries, indent=1), encoding="utf-8")
        os.replace(partial, cache_dir / name)
    except OSError:
        pass  # asked again next time: the answer is still right for this process


_MEMORY: dict[str, dict[str, list[str]]] = {}


# --- denying AMX to this process ---------------------------------------------------------------

_ARCH_PRCTL = 158  # x86-64
_SECCOMP = 317
_ARCH_REQ_XCOMP_PERM = 0x1023
_AUDIT_ARCH_X86_64 = 0xC000003E
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_LOAD_WORD, _JUMP_IF_EQUAL, _RETURN = 0x20, 0x15, 0x06
_ALLOW, _FAIL_WITH = 0x7FFF0000, 0x00050000


def deny_amx() -> bool:
    """Make the kernel refuse AMX state to every thread of this process, so llama.cpp's AMX buffer
    type reports itself unavailable (`ggml_amx_init`) and only CPU_REPACK is used. Must run before the
    first model load; cannot be undone. False where it cannot be done (not Linux on x86-64)."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    import ctypes  # here: the config imports this module for its names, at every start

    class Filter(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    program = b"".join(struct.pack("<HBBI", *instruction) for instruction in (
        (_LOAD_WORD, 0, 0, 4),  # the system call's architecture
        (_JUMP_IF_EQUAL, 0, 5, _AUDIT_ARCH_X86_64),
        (_LOAD_WORD, 0, 0, 0),  # its number
        (_JUMP_IF_EQUAL, 0, 3, _ARCH_PRCTL),
        (_LOAD_WORD, 0, 0, 16),  # its first argument
        (_JUMP_IF_EQUAL, 0, 1, _ARCH_REQ_XCOMP_PERM),
        (_RETURN, 0, 0, _FAIL_WITH | errno.EPERM),
        (_RETURN, 0, 0, _ALLOW),
    ))
    libc = ctypes.CDLL(None, use_errno=True)
    fprog = Filter(len(program) // 8, program)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    result: int = libc.syscall(_SECCOMP, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(fprog))
    return result == 0
