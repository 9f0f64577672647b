"""What outlives one conversation, owned in one place: the model in use, its loader and the message waiting
for it, the history, the price, the settings a new chat starts from, and the operations that touch several
stores at once. No Textual here: the chat UI and the commands (`tui-chat run`, `models rm`) go through the
same object, as they drive the same `ChatSession`.

The model in use is one (name, backend) pair, and it changes only when a load succeeds: until then the chat
stays on the model that answers, so a reply is always saved under the name of the model that wrote it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import Config, ConfigError, config_path, kv_cache_dir, load_config, log_dir, models_dir, save_setting
from .engine.base import Backend, Comparing, EngineError, Error, Loaded, ModelInfo
from .engine.factory import BackendOpener
from .engine.params import LiveParams
from .history import Conversation, History, HistoryError, ToolSwitches
from .pricing import find_preset
from .recording import Saving
from .replies import Again, Ask, Asked, BranchAt, Held, Outcome, Refused, SideBySide, Started
from .session import ChatSession, opened

if TYPE_CHECKING:
    from .engine.base import ToolCall
    from .engine.local import KvStore
    from .hub.local import LocalModel
    from .tools.loop import Consent, Decision, ToolUse
    from .tools.mcp import Tool, ToolServers
    from .tools.settings import ServerSpec

OpenBackend = Callable[[str | None], Backend]  # a BackendOpener, or a test's own
UNSENT_FILE = "unsent-message.txt"  # beside the history: a message held for a load, until it is sent


def nobody_consents(_call: ToolCall) -> concurrent.futures.Future[Decision]:
    """The Workspace's consent until a front-end sets its own: no call runs."""
    from .tools.loop import decided

    return decided("deny")


def kv_store(config: Config) -> KvStore:
    """The KV states saved on disk, as every front-end reaches them (numpy comes in with it: only when asked)."""
    from .engine.local import KvStore

    return KvStore(kv_cache_dir(), config.kv_cache_budget_bytes)


@dataclass(frozen=True, slots=True)
class ModelInUse:
    """The model that answers: `name` is what opens it again (saved with each chat and reply)."""

    name: str
    backend: Backend


@dataclass(eq=False)
class LoadJob:
    """One load; the events it sends say which job they belong to."""

    name: str | None
    fallback: str | None = None  # opened instead when `name` cannot be opened (the starter, for a lost default)
    backend: Backend | None = None
    note: str = ""  # what the user should know about this load (a fallback taken)

    @property
    def shown(self) -> str:
        return self.name or "the default model"


@dataclass(frozen=True, slots=True)
class Removed:
    """What removing a model did: its KV states went with it, and a default it was is reset."""

    model: LocalModel
    caches: int
    was_default: bool


class Workspace:
    def __init__(self, config: Config, open_backend: OpenBackend | None = None, history: History | None = None) -> None:
        """`open_backend`: None where nothing is opened (`models rm`)."""
        self.config = config  # as it is now: a setting changed in the app is written here and to the file
        self.open_backend = open_backend
        self.history = history
        self.model: ModelInUse | None = None
        self.loading: LoadJob | None = None
        self.queued: str | None = None  # a message sent before the model was ready: sent when it is
        self.price = find_preset(config.prices, config.price)
        self.streaming = True  # for every chat of this run
        self.session: ChatSession | None = None
        self._tool_servers: ToolServers | None = None
        # Who says yes to a tool call: set once by the front-end (the chat screen asks in a dialog; `run` answers
        # from --approve); until then, nobody, which is a no
        self.consent: Consent = nobody_consents

    @property
    def tool_servers(self) -> ToolServers:
        """The MCP servers of this run: they live as long as the app, started when a chat first needs one."""
        if self._tool_servers is None:
            from .tools.mcp import ToolServers

            self._tool_servers = ToolServers(log_dir())
        return self._tool_servers

    def start_tool_server(self, name: str) -> list[Tool]:
        """A configured server's tools, started now if it is not running (blocks up to `start_timeout_s`: off
        the UI thread). Raises ToolError (one line)."""
        settings = self.config.mcp
        return self.tool_servers.start(settings.servers[name], settings.start_timeout_s)

    def reload_tool_servers(self) -> str:
        """The config's [mcp] read again (F9 opens on the file as it is now, servers added while the app runs
        included); a line saying why where it cannot be read (the servers known stay, as where it is gone)."""
        if not config_path().is_file():
            return ""
        try:
            mcp = load_config().mcp
        except ConfigError as error:
            return f"{error}: the tool servers read before are shown"
        self.config = replace(self.config, mcp=mcp)
        return ""

    def start_tools(self, specs: Sequence[ServerSpec], choice: str) -> None:
        """`run --mcp`: these servers started (blocks up to `start_timeout_s` each) and all their tools on for the
        chat, not kept with it (they are not the config's). Raises ToolError or InvalidParameter."""
        tools = [tool for spec in specs for tool in self.tool_servers.start(spec, self.config.mcp.start_timeout_s)]
        self.use_tools(tools, choice, remember=False)

    def use_tools(self, tools: list[Tool], choice: str, *, remember: bool = True) -> None:
        """The chat's tools from its next reply: those switched on, and how the model may call them (none on:
        no tools), each call asked of `consent`; kept with the chat (`remember`: not when a reopened chat gets
        back part of what it had). "Always" answers given in this chat stay. Raises InvalidParameter (a choice
        naming a tool that is off; two tools of one name)."""
        from .tools.setup import tool_use

        session = self.session
        if session is None:
            return
        previous = session.tools
        use = tool_use(self.tool_servers, tools, self.config.mcp, self.backend.info if self.backend else None,
                       choice, self.consent) if tools else None
        if previous is not None and use is not None:
            use.always = previous.always
        session.tools = use
        if remember:
            session.tool_switches = ToolSwitches(tuple((tool.server, tool.name) for tool in tools), choice)
            session.keep_settings()

    def start_chat_tools(self, switches: ToolSwitches) -> tuple[list[Tool], list[str]]:
        """The tools a reopened chat had on, their servers started (blocks: off the UI thread), and a line for
        each server or tool that is not there any more."""
        from .tools.mcp import ToolError

        tools: list[Tool] = []
        notes: list[str] = []
        for server in dict.fromkeys(server for server, _tool in switches.on):
            if server not in self.config.mcp.servers:
                notes.append(f"MCP server {server!r} is not in the config any more: its tools are off")
                continue
            try:
                listed = self.start_tool_server(server)
            except ToolError as error:
                notes.append(str(error))
                continue
            tools += [tool for tool in listed if (tool.server, tool.name) in switches.on]
            gone = [name for named, name in switches.on if named == server and all(t.name != name for t in listed)]
            notes += [f"MCP server {server!r} no longer lists {name!r}" for name in gone]
        return tools, notes

    @property
    def chat_tools(self) -> ToolUse | None:
        """The chat's tools (None: it has none on)."""
        return self.session.tools if self.session is not None else None

    @property
    def backend(self) -> Backend | None:
        return self.model.backend if self.model is not None else None

    @property
    def model_name(self) -> str:
        return self.model.name if self.model is not None else ""

    @property
    def chats(self) -> History:
        """The history, for what works on saved chats (offered only where it opened). Raises HistoryError."""
        if self.history is None:
            raise HistoryError("the history is not open: chats are not saved in this run")
        return self.history

    def open_history(self, path: Path) -> None:
        """Raises HistoryError: the caller says the session is not saved."""
        self.history = History(path)

    def close(self) -> None:
        if self.session is not None:
            self.session.abandon()  # quitting mid-reply: the reply is kept as stopped, not left "streaming"
            self.session.keep_settings()
        if self.history is not None:
            self.history.close()
            self.history = None
        if self._tool_servers is not None:
            self._tool_servers.close()
            self._tool_servers = None

    # --- chats ----------------------------------------------------------------------------------

    def saving(self) -> Saving | None:
        return Saving(self.history, self.price) if self.history is not None else None

    def new_chat(self, live: LiveParams, **options: Any) -> ChatSession:
        """A new chat from the config's settings, on the model in use."""
        defaults: dict[str, Any] = {"system_prompt": self.config.system_prompt,
                                    "top_logprobs": self.config.inspector_top, "thinking": self.config.thinking,
                                    "streaming": self.streaming}
        return self._adopt(ChatSession(live, saving=self.saving(), **(defaults | options)))

    def reopen(self, conversation_id: int, live: LiveParams,
               **options: Any) -> tuple[ChatSession, Conversation, str | None]:
        """A saved chat to go on with, on the model in use until its own has loaded; returns it, the saved
        conversation and the model to load for it (None: the one in use). Raises HistoryError."""
        conversation = self.chats.load(conversation_id)
        defaults: dict[str, Any] = {"top_logprobs": self.config.inspector_top, "streaming": self.streaming}
        session = opened(conversation, live, self.saving(), **(defaults | options))
        wanted = conversation.model if conversation.model and conversation.model != self.model_name else None
        return self._adopt(session), conversation, wanted

    def _adopt(self, session: ChatSession) -> ChatSession:
        """The chat written now: its replies are the model in use's."""
        if self.session is not None and self.session is not session:
            self.session.abandon()
            self.session.keep_settings()
        if self.model is not None:
            session.model = self.model.name
        self.session = session
        return session

    def delete_chat(self, conversation_id: int) -> threading.Thread:
        """A chat, and the KV states saved from it on a thread of their own (each file's record is read): the
        chat is gone when this returns. Raises HistoryError (nothing deleted)."""
        self.chats.delete(conversation_id)
        forget = threading.Thread(target=kv_store(self.config).forget, args=(str(conversation_id),),
                                  name="forget-kv", daemon=True)
        forget.start()
        return forget

    # --- starting a reply -------------------------------------------------------------------------

    def start_reply(self, asked: Asked) -> Outcome:
        """The one way a reply starts: a message is held for a load on its way, anything else waits for the load
        (the model in use is about to go), there must be a model and nothing being written, and the reply is the
        model in use's, recorded with it."""
        if isinstance(asked, Ask) and self.hold(asked.text):
            assert self.loading is not None, "hold keeps a message only for a load on its way"
            return Held(self.loading.shown)
        if (reason := self.why_not_reply(asked)) is not None:
            return Refused(reason)
        backend, session = self.backend, self.session
        assert backend is not None and session is not None, "why_not_reply: a model and a chat"
        session.model = self.model_name
        match asked:
            case SideBySide(request, columns):
                assert isinstance(backend, Comparing), "why_not_reply: a backend with a lab"
                return Started(None, backend.compare(request, columns))
            case Ask(text):
                turn = session.ask(text, backend.generate)
            case Again("regenerate"):
                turn = session.regenerate(backend.generate)
            case Again():
                turn = session.continue_reply(backend.generate)
            case BranchAt(_, index, candidate):
                turn = session.branch(index, candidate, backend.generate)
        assert session.writing is not None, "the session writes the reply it started"
        return Started(turn, session.writing.stream)

    def why_not_reply(self, asked: Asked) -> str | None:
        """Why `asked` cannot start now (None: it can)."""
        if (busy := self._busy(sending=isinstance(asked, Ask))) is not None:
            return busy
        session = self.session
        assert session is not None, "_busy: a chat"
        if isinstance(asked, SideBySide):
            return self.why_not_side_by_side()
        if isinstance(asked, Again):
            return session.why_not_reply(asked.how)
        if isinstance(asked, BranchAt):
            return session.why_not_branch(asked.turn)
        return None

    def why_not_side_by_side(self) -> str | None:
        """Why the lab could not run its columns now (the lab asks before it opens, too)."""
        return self._busy(sending=False) or (
            None if isinstance(self.backend, Comparing) else "This model's backend has no sampling lab.")

    def _busy(self, sending: bool) -> str | None:
        """What stops any reply: one being written, a load on its way (a message sent waits for it, if none
        waits already), no model."""
        session = self.session
        if session is not None and session.writing is not None:
            return "A reply is still being written: Esc stops it."
        if self.loading is not None:
            return ("A message is already waiting for the model." if sending else
                    f"Loading {self.loading.shown}: try again once it is loaded.")
        if self.backend is None or session is None:
            return "No model is loaded: Ctrl+O opens one."
        return None

    # --- the model ------------------------------------------------------------------------------

    def start_load(self, name: str | None, fallback: str | None = None) -> LoadJob:
        """A load on its way; the model in use stays until it has loaded. A message held for an earlier load
        waits for this one."""
        self.loading = LoadJob(name, fallback)
        return self.loading

    def hold(self, text: str) -> bool:
        """Keep a message for the model being loaded; False when none is on its way or one is already held. It is
        written beside the history at once: a load can take long (the CPU's self-test) and can die (kill -9, a
        crash), and a message the user sent is not lost with it (`unsent` gives it back at the next start)."""
        if self.loading is None or self.queued is not None:
            return False
        self.queued = text
        if (unsent := self._unsent_file()) is not None:
            with contextlib.suppress(OSError):
                unsent.write_text(text, encoding="utf-8")
        return True

    def release(self) -> str | None:
        text, self.queued = self.queued, None
        if (unsent := self._unsent_file()) is not None:
            unsent.unlink(missing_ok=True)
        return text

    def unsent(self) -> str | None:
        """A message held for a load that never finished, in an earlier run (once: it is the caller's now)."""
        unsent = self._unsent_file()
        if unsent is None or self.queued is not None:
            return None
        try:
            text = unsent.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        unsent.unlink(missing_ok=True)
        return text or None

    def _unsent_file(self) -> Path | None:
        return self.history.path.with_name(UNSENT_FILE) if self.history is not None else None

    def open(self, job: LoadJob) -> Backend:
        """Open the job's backend (off the UI thread: imports and file checks); its `load()` follows.
        Raises EngineError."""
        opener = self.open_backend
        assert opener is not None, "only a workspace that opens models loads one"
        try:
            job.backend = opener(job.name)
        except EngineError as error:
            if job.fallback is None:
                raise
            job.note = f"The default model did not open ({error}): the starter model opens instead."
            job.name = job.fallback
            job.backend = opener(job.fallback)
        return job.backend

    def loaded(self, job: LoadJob, info: ModelInfo) -> Backend | None:
        """The job's model answers from now on, in the chat too; returns the backend it replaces, to close
        (its reply in flight ends as stopped)."""
        self._ended(job)
        assert job.backend is not None, "a job's model loads after `open`"
        previous = self.backend
        self.model = ModelInUse(job.name or self.config.default_model or info.path, job.backend)
        if self.session is not None:
            self.session.model = self.model.name
            if self.session.tools is not None:  # they are called in the new model's form (a server's: its API's)
                from .tools.calls import call_form

                self.session.tools.form = call_form(info)
        return previous if previous is not job.backend else None

    def failed(self, job: LoadJob) -> None:
        """A failed load changes nothing: the model in use, if any, goes on answering."""
        self._ended(job)

    def _ended(self, job: LoadJob) -> None:
        if self.loading is job:
            self.loading = None

    def load_now(self, name: str | None) -> Backend:
        """Open and load `name` here and now (`tui-chat run`). Raises EngineError."""
        job = self.start_load(name)
        backend = self.open(job)
        final = backend.load().result()
        if isinstance(final, Error):
            self.failed(job)
            backend.close()
            raise EngineError(final.message)
        assert isinstance(final, Loaded), "a load ends loaded or in an error"
        self.loaded(job, final.info)
        return backend

    # --- settings kept in the config ------------------------------------------------------------

    def local_options(self) -> tuple[int, int | None]:
        """The context size and GPU layers a local model opens with."""
        if isinstance(self.open_backend, BackendOpener):  # a test's own opener has no options
            return self.open_backend.local.n_ctx, self.open_backend.local.gpu_layers
        return self.config.n_ctx, self.config.gpu_layers

    def reconfigure(self, n_ctx: int, gpu_layers: int | None) -> None:
        """Another context size or GPU layer count: models open with them from now on, and at the next start.
        Raises OSError when the config cannot be written (they still apply now)."""
        opener = self.open_backend
        if not isinstance(opener, BackendOpener) or (n_ctx, gpu_layers) == (opener.local.n_ctx,
                                                                            opener.local.gpu_layers):
            return
        self.open_backend = opener.reconfigured(n_ctx=n_ctx, gpu_layers=gpu_layers)
        self.config = replace(self.config, n_ctx=n_ctx, gpu_layers=gpu_layers)
        save_setting("n_ctx", n_ctx)
        if gpu_layers is not None:
            save_setting("gpu_layers", gpu_layers)

    def set_price(self, name: str) -> None:
        """The price replies are costed at, the chat's saved ones from now on too. Raises OSError when the
        config cannot be written (the price still applies now)."""
        self.price = self.config.prices[name]
        if self.session is not None and self.session.saved is not None:
            self.session.saved.price = self.price
        if name != self.config.price:
            self.config = replace(self.config, price=name)
            save_setting("price", name)

    def set_default_model(self, name: str) -> None:
        """Raises OSError."""
        save_setting("default_model", name)
        self.config = replace(self.config, default_model=name)

    def default_path(self) -> Path | None:
        """The default model's file, when it can be found without any work (no unpacking, no network): the
        configured one, or the starter when none is configured or it is named."""
        from .engine.factory import model_file
        from .engine.models import is_starter, starter_file

        default = self.config.default_model
        if not default or is_starter(default):
            return starter_file(models_dir())
        try:
            return model_file(default, None, models_dir())
        except EngineError:
            return None

    def remove_model(self, name: str) -> Removed:
        """A local model's files, its saved KV states, and the default it was (the starter opens instead at the
        next start, not a missing file). Raises HubError; OSError when the config cannot be written."""
        from .hub.local import remove_model

        default = self.default_path()
        model = remove_model(models_dir(), name)
        caches = kv_store(self.config).forget_model(model.path)
        was_default = bool(self.config.default_model) and model.path == default
        if was_default:
            self.config = replace(self.config, default_model=None)
            save_setting("default_model", "")
        return Removed(model, caches, was_default)
