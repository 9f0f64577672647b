"""Which of llama.cpp's CPU weight layouts this machine can run, found out once, in a child process.

At load llama.cpp copies weights into "extra buffer types": CPU_REPACK (interleaved Q4_0/Q4_K/IQ4_NL
rows for AVX2/AVX-512/NEON) and, where the build and the CPU have Intel AMX, the AMX layout. On some
AMX machines (virtualised Sapphire and Granite Rapids) the AMX kernels crash the process on its first
decode (llama.cpp #20824, Ollama #17249, #17006). So before a model whose weights would meet those
kernels loads on such a machine, a child process loads it and decodes a few tokens: a crash there costs
nothing. The answer is kept per llama.cpp build and CPU. The ladder, fastest first:

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
from collections.abc import Callable, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AUTO = "auto"
PATHS = ("all", "no-amx", "none")
CHOICES = (AUTO, *PATHS)
PROBE_TIMEOUT_S = 300.0
CACHE_FILE = "cpu-path.json"
# ggml types the AMX buffer takes (amx/amx.cpp supports_op): F16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS
AMX_TYPES = frozenset({1, 2, 3, 8, 12, 13, 14, 23})
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
    reason: str = ""  # why not the default: "crashed its self-test", "set in the config"...

    @property
    def extra_buffers(self) -> bool:
        return self.name != "none"

    def describe(self) -> str:
        """For the model info: `AVX-512 · AMX off (crashed its self-test)`."""
        parts = [self.simd] if self.simd else []
        why = f" ({self.reason})" if self.reason else ""
        if self.amx:
            parts.append(f"AMX {'on' if self.name == 'all' else 'off'}{why}")
        if self.name == "none":
            parts.append(f"no repacking{'' if self.amx else why}")
        return " · ".join(parts)


def choose(setting: str, model: Path, tensor_types: Set[int], cache_dir: Path | None, features: set[str],
           probe: Probe | None = None, cpu_identity: str | None = None) -> CpuPath:
    """The path to load `model` with: forced by `setting`, remembered for this build and CPU, or probed (only
    where its weights, `tensor_types` from its header, would meet the AMX kernels)."""
    amx = "AMX_INT8" in features
    simd = next((name for flag, name in SIMD_NAMES if flag in features), "")
    if setting != AUTO:
        return CpuPath(setting, amx, simd, "set in the config" if setting != "all" else "")
    if not amx:
        return CpuPath("all", amx, simd)
    key = _cache_key(features, cpu_identity or _cpu_identity())
    known = _remembered(cache_dir, key)
    if known is not None:
        return CpuPath(known[0], amx, simd, known[1])
    if not tensor_types & AMX_TYPES:
        return CpuPath("all", amx, simd, "not checked: this model's weights do not use AMX")
    return _probe_ladder(model, probe or run_probe, cache_dir, key, amx, simd)


def known(setting: str, cache_dir: Path | None, features: set[str]) -> str:
    """What the next load will use, as far as it is known without a model (for `tui-chat info`)."""
    if setting != AUTO:
        return f"{setting} (set in the config or by a flag)"
    if "AMX_INT8" not in features:
        return "all (no AMX in this build, nothing to test)"
    remembered = _remembered(cache_dir, _cache_key(features, _cpu_identity()))
    if remembered is None:
        return "not tested yet: the first model whose weights use AMX is tested in a child process"
    return f"{remembered[0]}" + (f" (AMX {remembered[1]})" if remembered[1] else " (AMX passed its self-test)")


def _probe_ladder(model: Path, probe: Probe, cache_dir: Path | None, key: str, amx: bool, simd: str) -> CpuPath:
    for name in PATHS[:-1]:
        result = probe(model, name)
        if result.ok:
            reason = "" if name == "all" else "crashed its self-test"
            return _remember(cache_dir, key, CpuPath(name, amx, simd, reason))
        if not result.conclusive:
            return CpuPath("none", amx, simd, "its self-test did not finish")
    return _remember(cache_dir, key, CpuPath("none", amx, simd, "crashed its self-test"))


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


def _remembered(cache_dir: Path | None, key: str) -> tuple[str, str] | None:
    entry = _read_cache(cache_dir).get(key) if cache_dir else _MEMORY.get(key)
    if isinstance(entry, list) and len(entry) == 2 and entry[0] in PATHS and isinstance(entry[1], str):
        return entry[0], entry[1]
    return None


def _remember(cache_dir: Path | None, key: str, path: CpuPath) -> CpuPath:
    _MEMORY[key] = [path.name, path.reason]
    if cache_dir is not None:
        entries = _read_cache(cache_dir) | {key: [path.name, path.reason]}
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            partial = cache_dir / f"{CACHE_FILE}.partial"
            partial.write_text(json.dumps(entries, indent=1), encoding="utf-8")
            os.replace(partial, cache_dir / CACHE_FILE)
        except OSError:
            pass  # asked again next time: the answer is still right for this process
    return path


def _read_cache(cache_dir: Path) -> dict[str, Any]:
    try:
        entries = json.loads((cache_dir / CACHE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


_MEMORY: dict[str, list[str]] = {}


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
