"""F9: the MCP servers of the config and their tools, with this chat's switches: a server on or off (all its
tools), a tool on or off, and how the model may call them (auto, none, required, or one tool by name).

A server is started when this screen first lists it, each on a thread of its own (a slow one holds up neither
the UI nor the others); one that does not start is one line. Every change applies to the chat's next reply
(the Workspace sets `session.tools`). Names and descriptions come from the servers: untrusted, shown literally.
"""

from __future__ import annotations

from functools import partial

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import Select, Static, Switch

from ...config import config_path
from ...engine.params import InvalidParameter
from ...safetext import screen_safe
from ...session import ChatSession
from ...tools.calls import AUTO, CHOICES, NONE
from ...tools.mcp import Tool, ToolError
from ...workspace import Workspace
from .dialog import Dialog

DESCRIPTION_CHARS = 70


class ToolsScreen(Dialog[None]):
    BINDINGS = [Binding("escape", "dismiss", "Close", tooltip="Close (the switches apply already)")]
    DEFAULT_CSS = """
    ToolsScreen > Vertical { width: 100; }
    ToolsScreen #servers { height: auto; max-height: 24; }
    ToolsScreen Horizontal { height: auto; }
    ToolsScreen Switch { height: 3; }
    ToolsScreen .tool { padding: 0 0 0 4; }
    ToolsScreen .name { padding: 1 1 0 1; width: 1fr; }
    ToolsScreen .state { padding: 0 0 0 4; color: $text-muted; }
    ToolsScreen .state.-error { color: $error; }
    ToolsScreen .state.-warning { color: $warning; }
    ToolsScreen .hint { color: $text-muted; }
    ToolsScreen #choice-row { margin: 1 0 0 0; }
    ToolsScreen #choice-label { padding: 1 1 0 0; width: auto; }
    ToolsScreen #choice { width: 40; }
    ToolsScreen #note { color: $error; display: none; }
    ToolsScreen #no-tool { color: $warning; }
    """

    def __init__(self, workspace: Workspace) -> None:
        super().__init__()
        self.workspace = workspace
        self.servers = list(workspace.config.mcp.servers)
        self.tools: dict[Switch, Tool] = {}
        self.server_switches: dict[str, Switch] = {}
        session = workspace.session  # the chat's choice, kept while no tool (or not the one it names) is on
        self.choice = session.tool_switches.choice if session is not None else AUTO

    def compose(self) -> ComposeResult:
        settings = self.workspace.config.mcp
        with Vertical() as box:
            box.border_title = "Tools for this chat"
            if not self.servers:
                yield Static(Content(f"No MCP servers are configured: add one as [mcp.servers.NAME] to "
                                     f"{config_path()} (see the README's Tools section); F9 reads it again "
                                     "each time it opens."), classes="hint")
            # How the model may call them, first: its list opens over the servers below, inside the box (at the
            # foot of the box it drew over the border and past it)
            with Horizontal(id="choice-row"):
                yield Static(Content("The model may call them:"), id="choice-label")
                shown = CHOICES if self.choice in CHOICES else (*CHOICES, self.choice)  # a tool's name too
                yield Select([(choice, choice) for choice in shown], value=self.choice, allow_blank=False,
                             id="choice")
            yield Static(id="no-tool")
            with VerticalScroll(id="servers"):
                for index, name in enumerate(self.servers):
                    with Horizontal(classes="server"):
                        switch = self.server_switches[name] = Switch(disabled=True, id=f"server-{index}")
                        yield switch
                        yield Static(Content(screen_safe(f"{name}  ({settings.servers[name].shown})")),
                                     classes="name")
                    yield Static(Content("starting…"), classes="state", id=f"state-{index}")
            yield Static(id="note")
            yield Static(Content("auto: when it wants · none: never · required: its first step is a call · a tool's "
                                 "name: that one first. Applies from the next reply. Esc closes."), classes="hint")

    def on_mount(self) -> None:
        self._show_no_tool()
        for name in self.servers:
            self.run_worker(partial(self._start, name), thread=True, group="start-servers", exit_on_error=False)

    # --- starting the servers (a thread each) ----------------------------------------------------------

    def _start(self, name: str) -> None:
        try:
            tools = self.workspace.start_tool_server(name)
        except ToolError as error:
            self.app.call_from_thread(self._failed, name, str(error))
            return
        self.app.call_from_thread(self._listed, name, tools)

    def _state(self, name: str) -> Static:
        return self.query_one(f"#state-{self.servers.index(name)}", Static)

    def _failed(self, name: str, message: str) -> None:
        if self.is_attached:
            state = self._state(name)
            state.update(Content(screen_safe(message)))
            state.add_class("-error")

    def _listed(self, name: str, tools: list[Tool]) -> None:
        if not self.is_attached:
            return
        state = self._state(name)
        left_out = "".join(f"\n{line}" for line in self.workspace.tool_servers.left_out(name))
        state.update(Content(screen_safe(f"{len(tools)} tool{'s' if len(tools) != 1 else ''}{left_out}")))
        state.set_class(bool(left_out), "-warning")
        on = self._on_now()
        rows = []
        for tool in tools:
            switch = Switch((tool.server, tool.name) in on)
            self.tools[switch] = tool
            described = " ".join(tool.description.split())
            if len(described) > DESCRIPTION_CHARS:
                described = described[: DESCRIPTION_CHARS - 1] + "…"
            rows.append(Horizontal(switch, Static(Content(screen_safe(f"{tool.name} · {described}")), classes="name"),
                                   classes="tool"))
        self.query_one("#servers").mount_all(rows, after=state)
        server = self.server_switches[name]
        server.disabled = not tools
        choice = self.query_one("#choice", Select)
        if tools and self.focused in (self.query_one("#servers"), choice) and not choice.expanded:
            server.focus()  # disabled while its server started, the switch was passed over by the first focus
        self._show_server(name)
        self._show_choices()

    def _on_now(self) -> set[tuple[str, str]]:
        use = self.workspace.chat_tools
        return {(tool.server, tool.name) for tool in use.tools} if use is not None else set()

    # --- the switches --------------------------------------------------------------------------------

    @on(Switch.Changed)
    def _switched(self, event: Switch.Changed) -> None:
        server = next((name for name, switch in self.server_switches.items() if switch is event.switch), None)
        if server is not None:
            for switch, tool in self.tools.items():
                if tool.server == server:
                    with switch.prevent(Switch.Changed):
                        switch.value = event.value
        else:
            self._show_server(self.tools[event.switch].server)
        self._show_choices()
        self._apply()

    @on(Select.Changed, "#choice")
    def _chose(self, event: Select.Changed) -> None:
        self.choice = str(event.value)
        self._apply()

    def _show_server(self, name: str) -> None:
        """A server's switch is on while any of its tools is."""
        switch = self.server_switches[name]
        with switch.prevent(Switch.Changed):
            switch.value = any(switch.value for switch, tool in self.tools.items() if tool.server == name)

    def _show_choices(self) -> None:
        """The choices: auto, none, required and the tools switched on (a tool switched off falls back to auto)."""
        select: Select[str] = self.query_one("#choice", Select)
        shown = (*CHOICES, *(tool.name for switch, tool in self.tools.items() if switch.value))
        with select.prevent(Select.Changed):
            select.set_options([(choice, choice) for choice in shown])
            select.value = self.choice if self.choice in shown else AUTO

    def _apply(self) -> None:
        """The chat's tools follow the switches; where they cannot (two tools of one name), the switches go back.
        A server that has not listed its tools on this screen yet has no switches: its tools stay as they
        were (the Select's change on mount comes before any server lists them)."""
        note = self.query_one("#note", Static)
        chosen = self.query_one("#choice", Select).value
        listed = {tool.server for tool in self.tools.values()}
        use = self.workspace.chat_tools
        kept = [tool for tool in use.tools if tool.server not in listed] if use is not None else []
        try:
            self.workspace.use_tools([*kept, *(tool for switch, tool in self.tools.items() if switch.value)],
                                     chosen if isinstance(chosen, str) else AUTO)
        except InvalidParameter as error:
            note.update(Content(screen_safe(str(error))))
            note.display = True
            on = self._on_now()
            for switch, tool in self.tools.items():
                with switch.prevent(Switch.Changed):
                    switch.value = (tool.server, tool.name) in on
            for name in self.servers:
                self._show_server(name)
            return
        note.display = False
        self._show_no_tool()

    def _show_no_tool(self) -> None:
        no_tool = self.query_one("#no-tool", Static)
        line = unused_choice_note(self.workspace.session) if self.workspace.session is not None else ""
        no_tool.update(Content(screen_safe(line)))
        no_tool.display = bool(line)


def unused_choice_note(session: ChatSession) -> str:
    """A tool choice that asks for a call (`required`, a tool's name) with no tool on has nothing to call: the
    reply is plain text, and this says so rather than leave the choice to look obeyed."""
    choice = session.tool_switches.choice
    if session.tools is not None or choice in (AUTO, NONE):
        return ""
    return (f"No tool is on for this chat: tool choice {choice!r} has nothing to call, so the model answers in "
            "plain text.")
