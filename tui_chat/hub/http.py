"""Talking to the hub: where it is, who we are, and every failure turned into one readable line.

We call the hub's JSON API ourselves instead of through `HfApi`: its calls retry network errors
for ~25 s with no timeout, and a models screen must say "offline" at once, not hang. From
huggingface_hub we take the shared HTTP session, the auth headers (HF_TOKEN or the token
`hf auth login` saved under HF_HOME) and the URL of a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from . import HubError, HubInputError

if TYPE_CHECKING:
    import httpx2

DEFAULT_ENDPOINT = "https://huggingface.co"
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 30.0
MAX_PAGES = 50
_TRUE = {"1", "ON", "YES", "TRUE"}


def endpoint() -> str:
    """Read at each call (huggingface_hub reads HF_ENDPOINT once, at import)."""
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


def offline() -> bool:
    return any(os.environ.get(name, "").upper() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


OFFLINE_MESSAGE = "offline (HF_HUB_OFFLINE is set): searching and downloading need the network; local models work"


def check_online() -> None:
    if offline():
        raise HubError(OFFLINE_MESSAGE)


def session() -> httpx2.Client:
    """huggingface_hub's shared client (its proxy settings, its user agent hook)."""
    check_online()
    from huggingface_hub import get_session

    return get_session()


def auth_headers() -> dict[str, str]:
    # exported, but through an __all__ computed at import, which mypy cannot read
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    return build_hf_headers()


def timeout(read_s: float = READ_TIMEOUT_S) -> httpx2.Timeout:
    import httpx2

    return httpx2.Timeout(read_s, connect=CONNECT_TIMEOUT_S)


def status_error(status: int, what: str, headers: dict[str, str]) -> HubError:
    """The message for a hub answer that is not a success: what the user can do about it."""
    logged_in = "authorization" in {key.lower() for key in headers}
    if status == 401:
        if logged_in:
            return HubInputError(f"{what}: the hub refused your token (401): check HF_TOKEN or run hf auth login again")
        return HubInputError(f"{what}: not found, or private and you are not logged in (401): "
                             "set HF_TOKEN or run hf auth login")
    if status == 403:
        return HubInputError(f"{what}: access denied (403): if the repo is gated, accept its terms on the hub "
                             "with the account whose token you use (HF_TOKEN or hf auth login)")
    if status == 404:
        return HubInputError(f"{what}: not found on the hub (404)")
    if status == 429:
        return HubError(f"{what}: the hub is rate-limiting us (429): try again in a minute")
    return HubError(f"{what}: the hub answered with HTTP {status}")


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Network and offline failures inside the block become one HubError line."""
    import httpx2
    from huggingface_hub.errors import OfflineModeIsEnabled

    try:
        yield
    except OfflineModeIsEnabled:
        raise HubError(OFFLINE_MESSAGE) from None
    except httpx2.TimeoutException:
        raise HubError(f"{what}: the hub at {endpoint()} did not answer in time") from None
    except (httpx2.TransportError, httpx2.TooManyRedirects) as error:
        raise HubError(f"{what}: cannot reach the hub at {endpoint()} ({type(error).__name__}): "
                       "are you offline? local models still work") from None


def get_pages(path: str, params: dict[str, Any] | None, what: str) -> Iterator[Any]:
    """Each JSON page of a hub listing, following its `Link: rel=next` header."""
    client, headers = session(), auth_headers()
    url: str | None = f"{endpoint()}{path}"
    for _ in range(MAX_PAGES):
        if url is None:
            return
        with translated(what):
            response = client.get(url, params=params, headers=headers, timeout=timeout())
        if response.status_code != 200:
            raise status_error(response.status_code, what, headers)
        try:
            yield json.loads(response.content)
        except (ValueError, UnicodeDecodeError):
            raise HubError(f"{what}: the hub sent an answer that is not JSON") from None
        url, params = response.links.get("next", {}).get("url"), None


def get_json(path: str, params: dict[str, Any], what: str) -> Any:
    return next(get_pages(path, params, what))
