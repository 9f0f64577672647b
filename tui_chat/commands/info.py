"""`tui-chat info` and `--version`: what users paste into a bug report.

Versions, what the llama.cpp build can use on this machine, and every path the app reads or writes.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import Config


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    info = commands.add_parser("info", description="Versions, the llama.cpp build's CPU features and devices, the CPU "
                                                   "path and threads in use, and every path tui-chat reads or writes.")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(run=run)


def run(args: argparse.Namespace, config: Config) -> int:
    return show(config, args.json)


def package_version(name: str) -> str:
    """The version in the name of the package's `NAME-VERSION.dist-info` folder, where installers put it: reading it
    with importlib.metadata loads the email package first (a sixth of `--version`'s time), which is left for what
    that name does not tell (an egg, a zip)."""
    wanted = _normalized(name)
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for folder in names:
            stem, dot, kind = folder.rpartition(".")
            project, _, version = stem.partition("-")
            if dot and kind == "dist-info" and version and _normalized(project) == wanted:
                return version
    return _version_from_metadata(name)


def _normalized(project: str) -> str:
    """A project's name as installers write it in the folder's (PEP 503, `_` for the separators)."""
    return re.sub(r"[-_.]+", "_", project).lower()


def _version_from_metadata(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def version_line() -> str:
    """From the packages' metadata, without loading llama.cpp: `--version` answers at once (its build, the ggml
    version and commit, is in `tui-chat info`)."""
    return (f"tui-chat {package_version('tui-chat')} · llama-cpp-python {package_version('llama-cpp-python')} · "
            f"textual {package_version('textual')} · python {platform.python_version()}")


def report(config: Config) -> dict[str, Any]:
    from ..config import cache_dir, config_path, data_dir, history_path, log_dir, models_dir
    from ..engine.local import (
        build_features,
        build_version,
        choose_threads,
        devices,
        known_cpu_paths as known,
        read_topology,
        supports_gpu_offload,
        system_info,
    )
    from ..engine.models import starter_installed
    from ..guard import LOG_NAME

    topology = read_topology()
    threads = choose_threads(topology)
    features = build_features()
    gpus = [d for d in devices() if d.kind != "CPU"]
    return {
        "versions": {
            "tui-chat": package_version("tui-chat"),
            "llama-cpp-python": package_version("llama-cpp-python"),
            "ggml": build_version(),
            "python": platform.python_version(),
            "textual": package_version("textual"),
            "huggingface-hub": package_version("huggingface-hub"),
        },
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        "cpu": {
            "model": _cpu_model(),
            "logical": topology.logical,
            "cores": topology.physical,
            "performance_cores": topology.performance,
            "quota": topology.quota,
            "build_features": system_info(),
            "extra_buffers": known(config.extra_buffers, cache_dir(), features),
            "threads": {"decode": config.threads or threads.decode, "batch": config.threads_batch or threads.batch,
                        "follow_load": not (config.threads and config.threads_batch)},
        },
        "gpu": {
            "offload": supports_gpu_offload(),
            "devices": [{"name": d.name, "description": d.description, "kind": d.kind,
                         "memory_total": d.memory_total, "memory_free": d.memory_free} for d in gpus],
        },
        "paths": {
            "config": str(config_path()),
            "data": str(data_dir()),
            "models": str(models_dir()),
            "history": str(history_path()),
            "log": str(log_dir() / "llama.log"),
            "stderr_log": str(log_dir() / LOG_NAME),
            "cache": str(cache_dir()),
        },
        "default_model": config.default_model or ("gemma-3-270m (starter)" if starter_installed() else None),
    }


def show(config: Config, as_json: bool) -> int:
    import json

    from ..units import format_size

    facts = report(config)
    if as_json:
        print(json.dumps(facts, indent=2))
        return 0
    versions, cpu, gpu, paths = facts["versions"], facts["cpu"], facts["gpu"], facts["paths"]
    threads = cpu["threads"]
    lines = [
        " · ".join(f"{name} {value}" for name, value in versions.items()),
        f"system      {facts['system']}",
        f"CPU         {cpu['model']} · {cpu['logical']} logical CPUs, {cpu['cores']} cores"
        + (f" ({cpu['performance_cores']} performance)" if cpu["performance_cores"] != cpu["cores"] else "")
        + (f" · limited to {cpu['quota']:g} by its cgroup" if cpu["quota"] else ""),
        f"build       {cpu['build_features']}",
        f"CPU path    {cpu['extra_buffers']}",
        f"threads     {threads['decode']} decoding, {threads['batch']} reading prompts"
        + (" (fewer while other programs keep cores busy)" if threads["follow_load"] else " (set)"),
        f"GPU offload {'yes' if gpu['offload'] else 'no: this llama.cpp build has no GPU backend'}",
        *(f"GPU         {d['name']}: {d['description']}, {format_size(d['memory_total'])} "
          f"({format_size(d['memory_free'])} free)" for d in gpu["devices"]),
        f"model       {facts['default_model'] or 'none configured'}",
        *(f"{name:<11} {path}" for name, path in paths.items()),
    ]
    print("\n".join(lines))
    return 0


def _cpu_model() -> str:
    from ..engine.local import cpu_model

    return cpu_model() or platform.processor() or platform.machine()
