"""What the benchmarks share: the model they time, greedy settings, rounds that alternate the sides, and
how their figures are written. The scripts run from this folder, so they import it as `shared`."""

from __future__ import annotations

import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

Result = TypeVar("Result")


def bench_model(model: Path | None) -> tuple[Path, Path]:
    """The .gguf to time (`model`, or the starter) and the fresh folder llama.cpp's log now goes to."""
    from tui_chat.config import models_dir
    from tui_chat.engine.local import logs
    from tui_chat.engine.models import resolve_model

    log_dir = Path(tempfile.mkdtemp(prefix="tui-chat-bench-"))
    logs.install(log_dir)
    return resolve_model(str(model) if model else None, None, models_dir()), log_dir


def model_arg(text: str) -> Path:
    """`--model`'s value: a .gguf path, or `proxy` for the starter's GPU-regime proxy (proxy.py), made once."""
    if text == "proxy":
        from proxy import proxy_model

        return proxy_model()
    return Path(text)


MODEL_HELP = "a .gguf file, or `proxy`: the starter's shape with tiny layers, the GPU's regime (default: the starter)"


def own_dirs(root: Path) -> dict[str, str]:
    """The environment with config, data, state and cache dirs of the benchmark's own under `root`: what it
    writes (chats, logs, KV states) never reaches the user's."""
    return os.environ | {f"XDG_{name}_HOME": str(root / name.lower()) for name in ("CONFIG", "DATA", "STATE", "CACHE")}


def greedy_settings(max_tokens: int) -> dict[str, float]:
    """Greedy, no repeat penalty, a fixed seed: the same reply each round (as `SamplingParams(**...)`)."""
    return {"temperature": 0.0, "repeat_penalty": 1.0, "max_tokens": max_tokens, "seed": 1}


def alternate(sides: dict[str, Callable[[], Result]], rounds: int) -> dict[str, list[Result]]:
    """Each round runs every side once, in the same order, so drifting load lands on all of them alike."""
    runs: dict[str, list[Result]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, run in sides.items():
            runs[name].append(run())
    return runs


def median(values: list[float | None]) -> float | None:
    """The median of the values measured (None: not measured that round)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def ms(seconds: float | None, spec: str = ".1f") -> str:
    return fmt(None if seconds is None else seconds * 1000, spec)
