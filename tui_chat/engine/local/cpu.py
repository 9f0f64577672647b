"""How many threads llama.cpp should use on this machine, right now.

llama.cpp's threads spin at every barrier: one thread more than there are free cores does not share
the machine, it stalls every step (measured: 2 threads with one of 2 cores busy elsewhere, 1.3-2.1 tok/s
against ~17 on 1 thread). So the count follows llama.cpp's own tools (physical cores that do math,
never hyper-threads) and then gives way to what other processes are using, checked between tokens.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..link import UI_PROCESS_ENV

SYS = Path("/sys")
PROC_STAT = Path("/proc/stat")
CHECK_EVERY_S = 0.5  # how often a running reply looks at the load again
MIN_WINDOW_S = 0.1  # a shorter look at /proc/stat is mostly rounding
FREE_ENOUGH = 0.75  # a core counts as free when at least this much of it is idle
# A token this quick is a GPU's regime (or a tiny model's): the app's own threads (the event sender, the UI) then
# wake as often as llama.cpp's barrier, and each wake-up that lands on a spinning llama.cpp thread stalls the step.
# There they get a core of their own: on the GPU-regime proxy (AMD EPYC, 2 cores) 1 thread decoded 340-470 tok/s
# in the app and `run` where 2 gave 320-340, and read a prompt 5 x as fast in the app.
FAST_STEP_MS = 5.0
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class Topology:
    """The CPUs this process may use, as cores: `performance` leaves out a hybrid CPU's efficiency cores."""

    logical: int
    physical: int
    performance: int
    quota: float | None = None  # a cgroup's CPU limit, in CPUs


@dataclass(frozen=True, slots=True)
class Threads:
    decode: int  # one token at a time: memory-bound, so the fast cores only
    batch: int  # prompt reading: compute-bound, every physical core helps

    def __str__(self) -> str:
        return f"{self.decode} thread{'s' if self.decode != 1 else ''}" + (
            f" ({self.batch} reading)" if self.batch != self.decode else "")


def read_topology(cpus: set[int] | None = None, sys_root: Path = SYS) -> Topology:
    """From sysfs: cores are (package, core) pairs, so hyper-thread siblings count once."""
    cpus = cpus if cpus is not None else _allowed_cpus()
    core_of = {cpu: _core_of(cpu, sys_root) for cpu in cpus}
    efficiency = _cpu_list(_read(sys_root / "devices/cpu_atom/cpus"))
    cores = set(core_of.values())
    efficiency_cores = {core for cpu, core in core_of.items() if cpu in efficiency}
    physical = max(1, len(cores))
    return Topology(
        logical=max(1, len(cpus)),
        physical=physical,
        performance=max(1, physical - len(efficiency_cores)),
        quota=_cgroup_quota(sys_root),
    )


def choose_threads(topology: Topology, busy_elsewhere: float = 0.0) -> Threads:
    """Threads for decoding and for reading prompts, leaving the CPUs other processes use to them.
    A busy hyper-thread still leaves its sibling free, so the load is taken from the logical CPUs."""
    free = min(topology.logical - max(0.0, busy_elsewhere), topology.quota or math.inf)
    fitting = max(1, math.floor(free + 1 - FREE_ENOUGH))
    return Threads(decode=min(topology.performance, fitting), batch=min(topology.physical, fitting))


class LoadWatch:
    """What else uses our CPUs, from /proc/stat minus the CPU time of the engine's own threads.

    The UI's main thread counts as "else": it shares the machine with llama.cpp. In one process (`run`, the tests)
    that is this process's main thread, whose time is taken out of the process's own (os.times). In an engine
    process of its own, the UI is the app's main thread, and the app's other threads (the socket's reader, the
    bridge that batches events for the screen) work for the engine: they count as its own, as they did when
    they lived in its process."""

    def __init__(self, cpus: set[int] | None = None, stat: Path = PROC_STAT, ui_process: int | None = None) -> None:
        self.cpus = cpus if cpus is not None else _allowed_cpus()
        self.stat = stat
        self.ui_process = ui_process or int(os.environ.get(UI_PROCESS_ENV) or os.getpid())
        self._last = self._sample()

    def busy_elsewhere(self) -> float | None:
        """CPUs' worth of work by other processes since the last call; None if too little time passed
        (or /proc/stat cannot be read), in which case the window keeps growing."""
        now = self._sample()
        if now is None or self._last is None:
            self._last = now
            return None
        wall, busy, own = (b - a for a, b in zip(self._last, now, strict=True))
        if wall < MIN_WINDOW_S:
            return None
        self._last = now
        return max(0.0, (busy - own) / wall)

    def _sample(self) -> tuple[float, float, float] | None:
        try:
            lines = self.stat.read_text().splitlines()
        except OSError:
            return None
        wanted = {f"cpu{cpu}" for cpu in self.cpus}
        busy_ticks = 0
        for line in lines:
            name, *fields = line.split()
            if name in wanted:
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
                busy_ticks += user + nice + system + irq + softirq + steal
        times = os.times()
        ui = self.ui_process
        ui_thread = _cpu_s(f"/proc/{ui}/task/{ui}/stat")
        if ui == os.getpid():  # the UI's thread is this process's main thread: not the engine's own
            own = times.user + times.system - ui_thread
        else:  # the app's other threads (its socket's reader, the bridge) work for the engine
            own = times.user + times.system + _cpu_s(f"/proc/{ui}/stat") - ui_thread
        return time.monotonic(), busy_ticks / _TICKS_PER_S, own


def _cpu_s(stat: str) -> float:
    """A process's or thread's CPU seconds (utime + stime, fields 14 and 15 of its stat); 0 if unreadable."""
    try:
        fields = Path(stat).read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(("model name", "Model"))), "")


def _allowed_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _core_of(cpu: int, sys_root: Path) -> tuple[str, str]:
    topology = sys_root / f"devices/system/cpu/cpu{cpu}/topology"
    return _read(topology / "physical_package_id") or "0", _read(topology / "core_id") or str(cpu)


def _cgroup_quota(sys_root: Path) -> float | None:
    """`cpu.max` of cgroup v2 ("200000 100000" is 2 CPUs; "max" is none)."""
    quota, _, period = (_read(sys_root / "fs/cgroup/cpu.max") or "max").partition(" ")
    try:
        return int(quota) / int(period)
    except ValueError:
        return None


def _cpu_list(text: str | None) -> set[int]:
    """sysfs CPU lists: "0-3,8,10-11"."""
    cpus: set[int] = set()
    for part in (text or "").split(","):
        first, _, last = part.strip().partition("-")
        if first.isdigit():
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


class ThreadGovernor:
    """The thread counts for the next decode: fixed where the user set them, else following the load.
    `retune` is cheap (two small /proc reads) and is called between prompt chunks and every ~0.5 s of
    decoding, so a build started mid-reply costs a few hundred milliseconds, not the rest of the reply."""

    def __init__(self, decode: int | None = None, batch: int | None = None, topology: Topology | None = None,
                 watch: LoadWatch | None = None) -> None:
        self.topology = topology or read_topology()
        self.fixed = decode, batch
        self.watch = None if decode and batch else (watch or LoadWatch())
        self.threads = self._with_fixed(choose_threads(self.topology))
        self.next_check = 0.0 if self.watch is not None else math.inf  # fixed counts: a loop never looks again

    def retune(self, now: float | None = None, step_ms: float | None = None) -> bool:
        """Look at the load again; True when the thread counts changed. `step_ms`: a decode step as last measured
        (None: not yet), below FAST_STEP_MS a core is kept for the app's own threads."""
        now = time.monotonic() if now is None else now
        if self.watch is None or now < self.next_check:
            return False
        self.next_check = now + CHECK_EVERY_S
        busy = self.watch.busy_elsewhere()
        if busy is None:
            return False
        own = 1.0 if step_ms is not None and step_ms < FAST_STEP_MS else 0.0
        threads = self._with_fixed(choose_threads(self.topology, busy + own))
        changed, self.threads = threads != self.threads, threads
        return changed

    def _with_fixed(self, chosen: Threads) -> Threads:
        decode, batch = self.fixed
        return Threads(decode or chosen.decode, batch or chosen.batch)
