"""Settings from one TOML file, validated once at start; the platformdirs places the app writes to."""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from .engine.local import AUTO_CPU_PATH, CPU_PATHS, check_draft
from .engine.params import InvalidParameter, SamplingParams, check_top_logprobs
from .engine.templates import AUTO, NAMED_TEMPLATES
from .pricing import DEFAULT_PRESET, PRESETS, Price, PricingError, find_preset, presets_with
from .tools.settings import McpSettings, parse_mcp

APP_NAME = "tui-chat"
CONTEXT_STEP = 256
DEFAULT_N_CTX = 4096
DEFAULT_INSPECTOR_TOP = 10
DEFAULT_REMOTE_TIMEOUT_S = 120.0
DEFAULT_KV_CACHE_BUDGET_GB = 4.0
MAX_KV_CACHE_BUDGET_GB = 1_000_000.0


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the setting."""


def config_dir() -> Path:
    return Path(platformdirs.user_config_dir(APP_NAME))


def data_dir() -> Path:
    return Path(platformdirs.user_data_dir(APP_NAME))


def log_dir() -> Path:
    return Path(platformdirs.user_log_dir(APP_NAME))


def cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir(APP_NAME))


def kv_cache_dir() -> Path:
    """Saved KV caches: data, not a cache dir the system may empty, since each one spares a long prompt read."""
    return data_dir() / "kv"


def config_path() -> Path:
    return config_dir() / "config.toml"


def models_dir() -> Path:
    return data_dir() / "models"


def history_path() -> Path:
    return data_dir() / "history.sqlite3"


@dataclass(frozen=True, slots=True)
class RemoteProfile:
    """An OpenAI-compatible server from `[remotes.NAME]` (name "" when given by flags alone).
    The key itself is read only when opening."""

    name: str
    base_url: str
    model: str | None = None
    api_key_env: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = DEFAULT_REMOTE_TIMEOUT_S

    def resolved_api_key(self) -> str | None:
        if not self.api_key_env:
            return self.api_key
        key = os.environ.get(self.api_key_env)
        if not key:
            source = f" (api_key_env of [remotes.{self.name}])" if self.name else ""
            raise ConfigError(f"the API key variable {self.api_key_env}{source} is not set")
        return key


@dataclass(frozen=True, slots=True)
class Config:
    default_model: str | None = None
    chat_template: str = AUTO
    n_ctx: int = DEFAULT_N_CTX
    gpu_layers: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    theme: str | None = None
    keys: dict[str, str] = field(default_factory=dict)
    price: str = DEFAULT_PRESET
    prices: dict[str, Price] = field(default_factory=lambda: dict(PRESETS))
    inspector_top: int = DEFAULT_INSPECTOR_TOP
    system_prompt: str = ""  # for new conversations; each conversation keeps its own
    remotes: dict[str, RemoteProfile] = field(default_factory=dict)
    threads: int | None = None  # decode threads; None: the physical cores, fewer while others keep them busy
    threads_batch: int | None = None  # prompt-reading threads; likewise
    extra_buffers: str = AUTO_CPU_PATH  # llama.cpp's CPU weight layouts: auto, all, no-amx, none
    kv_cache_budget_gb: float = DEFAULT_KV_CACHE_BUDGET_GB  # saved KV caches on disk in all; 0 saves none
    draft: str = "off"  # speculative decoding's drafter: ngram (prompt lookup) or off; [sampling] draft_max its length
    thinking: bool = True  # new chats let reasoning models think (each chat keeps and switches its own)
    mcp: McpSettings = field(default_factory=McpSettings)  # [mcp]: tool servers by name, and the calls' limits

    @property
    def kv_cache_budget_bytes(self) -> int:
        return int(self.kv_cache_budget_gb * 2**30)


def round_context(n_ctx: int) -> int:
    """llama.cpp pads n_ctx to a multiple of 256 internally; doing it here keeps our buffers in step."""
    return -(-n_ctx // CONTEXT_STEP) * CONTEXT_STEP


def check_context(n_ctx: Any) -> int:
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or not 256 <= n_ctx <= 1_048_576:
        raise InvalidParameter(f"n_ctx must be a whole number between 256 and 1048576 (got {n_ctx!r})")
    return round_context(n_ctx)


def check_gpu_layers(gpu_layers: Any) -> int:
    if isinstance(gpu_layers, bool) or not isinstance(gpu_layers, int) or gpu_layers < -1:
        raise InvalidParameter(f"gpu-layers must be -1 (all), 0 (CPU) or a layer count (got {gpu_layers!r})")
    return gpu_layers


def check_threads(threads: Any, name: str = "threads") -> int:
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024:
        raise InvalidParameter(f"{name} must be a whole number between 1 and 1024 (got {threads!r})")
    return threads


def check_extra_buffers(choice: Any) -> str:
    if not isinstance(choice, str) or choice not in CPU_PATHS:
        raise InvalidParameter(f"extra_buffers must be one of {', '.join(CPU_PATHS)} (got {choice!r})")
    return choice


def check_kv_cache_budget(gigabytes: Any) -> float:
    if (isinstance(gigabytes, bool) or not isinstance(gigabytes, (int, float))
            or not 0 <= gigabytes <= MAX_KV_CACHE_BUDGET_GB):
        raise InvalidParameter(f"kv_cache_budget_gb must be a number of gigabytes, 0 (save none) or more "
                               f"(got {gigabytes!r})")
    return float(gigabytes)


def check_template(name: Any) -> str:
    known = [AUTO, *NAMED_TEMPLATES]
    if not isinstance(name, str) or name not in known:
        raise InvalidParameter(f"chat_template must be one of {', '.join(known)} (got {name!r})")
    return name


def load_config(path: Path | None = None) -> Config:
    """The user's config, or the defaults when there is no file."""
    path = path or config_path()
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Config()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"cannot read config {path}: {error}") from None
    try:
        return _parse(raw)
    except (InvalidParameter, PricingError) as error:
        raise ConfigError(f"config {path}: {error}") from None


_TOP_LEVEL = {
    "default_model", "chat_template", "n_ctx", "gpu_layers", "sampling", "theme", "keys", "price", "prices",
    "inspector_top", "system_prompt", "remotes", "threads", "threads_batch", "extra_buffers", "kv_cache_budget_gb",
    "thinking", "mcp", "draft",
}


def _parse(raw: dict[str, Any]) -> Config:
    unknown = sorted(set(raw) - _TOP_LEVEL)
    if unknown:
        raise InvalidParameter(f"unknown setting {unknown[0]!r}")
    default_model = raw.get("default_model")
    if default_model is not None and not isinstance(default_model, str):
        raise InvalidParameter("default_model must be text")
    sampling = raw.get("sampling", {})
    if not isinstance(sampling, dict):
        raise InvalidParameter("[sampling] must be a table")
    gpu_layers = raw.get("gpu_layers")
    theme = raw.get("theme")
    if theme is not None and not isinstance(theme, str):
        raise InvalidParameter("theme must be text")
    keys = raw.get("keys", {})
    if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
        raise InvalidParameter('[keys] must map actions to keys, e.g. regenerate = "ctrl+r"')
    price_tables = raw.get("prices", {})
    if not isinstance(price_tables, dict):
        raise InvalidParameter('[prices] must hold tables such as [prices."My provider"]')
    prices = presets_with(price_tables)
    system_prompt = raw.get("system_prompt", "")
    if not isinstance(system_prompt, str):
        raise InvalidParameter("system_prompt must be text")
    price = find_preset(prices, str(raw.get("price", DEFAULT_PRESET))).name
    thinking = raw.get("thinking", True)
    if not isinstance(thinking, bool):
        raise InvalidParameter(f"thinking must be true or false (got {thinking!r})")
    return Config(
        default_model=default_model or None,
        chat_template=check_template(raw.get("chat_template", AUTO)),
        n_ctx=check_context(raw.get("n_ctx", DEFAULT_N_CTX)),
        gpu_layers=None if gpu_layers is None else check_gpu_layers(gpu_layers),
        sampling=SamplingParams().with_changes(**sampling),
        theme=theme,
        keys=keys,
        price=price,
        prices=prices,
        inspector_top=check_top_logprobs(raw.get("inspector_top", DEFAULT_INSPECTOR_TOP), "inspector_top"),
        system_prompt=system_prompt,
        remotes=_remotes(raw.get("remotes", {})),
        threads=_optional(raw, "threads", check_threads),
        threads_batch=_optional(raw, "threads_batch", check_threads),
        extra_buffers=check_extra_buffers(raw.get("extra_buffers", AUTO_CPU_PATH)),
        kv_cache_budget_gb=check_kv_cache_budget(raw.get("kv_cache_budget_gb", DEFAULT_KV_CACHE_BUDGET_GB)),
        thinking=thinking,
        draft=check_draft(raw.get("draft", "off")),
        mcp=parse_mcp(raw.get("mcp", {})),
    )


def _optional(raw: dict[str, Any], key: str, check: Any) -> Any:
    return None if raw.get(key) is None else check(raw[key], key)


_REMOTE_KEYS = {"base_url", "model", "api_key_env", "api_key", "timeout_s"}


def _remotes(tables: Any) -> dict[str, RemoteProfile]:
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise InvalidParameter('[remotes] must hold tables such as [remotes.lab] with base_url = "http://host:8080/v1"')
    return {name: _remote(name, table) for name, table in tables.items()}


def _remote(name: str, table: dict[str, Any]) -> RemoteProfile:
    where = f"[remotes.{name}]"
    unknown = sorted(set(table) - _REMOTE_KEYS)
    if unknown:
        raise InvalidParameter(f"{where}: unknown setting {unknown[0]!r} (known: {', '.join(sorted(_REMOTE_KEYS))})")
    for key in ("base_url", "model", "api_key_env", "api_key"):
        if key in table and not (isinstance(table[key], str) and table[key]):
            raise InvalidParameter(f"{where}: {key} must be non-empty text")
    base_url = table.get("base_url")
    if not base_url or not base_url.startswith(("http://", "https://")):
        raise InvalidParameter(f'{where}: base_url must be an http:// or https:// URL, e.g. "http://host:8080/v1"')
    if "api_key_env" in table and "api_key" in table:
        raise InvalidParameter(f"{where}: give api_key_env or api_key, not both")
    timeout = table.get("timeout_s", DEFAULT_REMOTE_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise InvalidParameter(f"{where}: timeout_s must be a number of seconds between 0 and 3600")
    return RemoteProfile(name, base_url, table.get("model"), table.get("api_key_env"), table.get("api_key"),
                         float(timeout))


def save_setting(key: str, value: str | int, path: Path | None = None) -> None:
    """Set one top-level setting (a text or a number), keeping the rest of the file (comments included) as written."""
    path = path or config_path()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        lines = []
    line = f"{key} = {json.dumps(value)}"
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
    table_start = next((i for i, text in enumerate(lines) if text.lstrip().startswith("[")), len(lines))
    existing = next((i for i in range(table_start) if pattern.match(lines[i])), None)
    if existing is None:
        lines.insert(table_start, line)
    else:
        lines[existing] = line
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(partial, path)
