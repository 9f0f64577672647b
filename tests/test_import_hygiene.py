"""The layers, checked: no Textual in the engine, the hub, the session or the server (`serve/`, which knows no
backend either); no llama_cpp in the UI, and none
outside the engine's local wing; the engine process's two sides know no backend; the engine reaches the hub only
through its factory, the hub never the engine; widgets never import screens nor the workspace; every chat key is a
room's of ui/chat/, the chat screen small across all it is built from, its rooms not its bases and none calling
another, and the App keeps to app concerns; the GGUF reader is a leaf; the engine link's table covers the
engine Protocols and nothing reads its messages by position; and no module imports itself round a cycle.

Every import counts, the ones inside functions too (they are how a layer would sneak in late)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from types import FunctionType

import pytest

import tui_chat

PACKAGE = Path(tui_chat.__file__).parent
LOCAL_WING = "tui_chat.engine.local"
TEXTUAL_FREE = ("tui_chat.engine", "tui_chat.hub", "tui_chat.session", "tui_chat.recording", "tui_chat.history",
                "tui_chat.pricing", "tui_chat.config", "tui_chat.safetext", "tui_chat.export", "tui_chat.lag",
                "tui_chat.workspace", "tui_chat.tools", "tui_chat.lab", "tui_chat.probe", "tui_chat.serve")
MAX_SCREEN_METHODS = 30  # a screen over this holds logic that belongs to the workspace, the session or a widget
MAX_APP_METHODS = 6
WIDGETS = ("tui_chat.ui.widgets", "tui_chat.ui.panel")  # the conversation's widgets, the side panel's
MAX_UI_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of everything `path` imports, wherever in it."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            named = {f"{base}.{alias.name}" for alias in node.names}
            found.update(named if named <= MODULE_NAMES else {base, *named})  # `from . import x`: x, not the package
    return found


MODULE_NAMES = {module_name(path) for path in PACKAGE.rglob("*.py")}
MODULES = {module_name(path): imports_of(path) for path in sorted(PACKAGE.rglob("*.py"))}


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def offenders(layer: str, forbidden: str, allowed: tuple[str, ...] = ()) -> list[str]:
    return sorted(f"{module} imports {name}" for module, names in MODULES.items()
                  if within(module, layer) and module not in allowed
                  for name in names if within(name, forbidden))


@pytest.mark.parametrize("layer", TEXTUAL_FREE)
def test_no_textual_below_the_ui(layer):
    assert offenders(layer, "textual") == [] and offenders(layer, "tui_chat.ui") == []


def test_no_llama_cpp_in_the_ui():
    assert offenders("tui_chat.ui", "llama_cpp") == []


def test_llama_cpp_only_in_the_engines_local_wing():
    assert offenders("tui_chat", "llama_cpp", allowed=tuple(m for m in MODULES if within(m, LOCAL_WING))) == []


def test_nothing_outside_the_engine_imports_the_local_wings_modules():
    """The llama.cpp wing's one door is its package: config, commands and workspace take the names it lists (each
    imported from its module only when asked for), never a module of it."""
    from tui_chat.engine import local

    wing = [name for name in MODULES if within(name, LOCAL_WING) and name != LOCAL_WING]
    through = sorted(f"{module} imports {name}" for module, names in MODULES.items()
                     if not within(module, "tui_chat.engine") for name in names
                     if any(within(name, inner) for inner in wing))
    assert through == []
    assert set(local.__all__) == set(local._DOOR)


@pytest.mark.parametrize("module", ["tui_chat.engine.process", "tui_chat.engine.host", "tui_chat.engine.link"])
def test_the_engine_process_and_its_link_know_no_backend(module):
    """The engine process runs whatever backend its first message builds, and the app's side of it only sends and
    receives: neither imports the local wing (llama.cpp is loaded there, by the backend) or a server's client."""
    assert offenders(module, LOCAL_WING) == [] and offenders(module, "tui_chat.engine.openai") == []


def test_the_links_table_covers_every_method_of_the_engine_protocols():
    """What an engine does is listed once (`link.CAPABILITIES`): a method added to a Protocol in base.py and not
    to the table would be missing over there, found only when a user reached it."""
    from tui_chat.engine.link import APP_SIDE, CAPABILITIES, ENGINE_PROTOCOLS

    declared = {name: protocol for protocol in ENGINE_PROTOCOLS for name, value in vars(protocol).items()
                if callable(value) and not name.startswith("_")}
    assert set(declared) == set(CAPABILITIES) | APP_SIDE
    assert {name: capability.protocol for name, capability in CAPABILITIES.items()} == {
        name: protocol for name, protocol in declared.items() if name not in APP_SIDE}


def test_the_engine_processs_proxy_is_declared_from_the_table():
    """The app's side runs over there exactly what the table lists, each method once, from the Protocol's own
    signature (`remote(Backend.generate)`), never a method written out by hand beside it."""
    from tui_chat.engine.base import Backend, Comparing
    from tui_chat.engine.link import CAPABILITIES, Remote
    from tui_chat.engine.process import EngineProcess, LocalEngineProcess

    def remotes(cls: type) -> set[str]:
        return {descriptor.capability.name for klass in cls.__mro__ for descriptor in vars(klass).values()
                if isinstance(descriptor, Remote)}

    assert remotes(LocalEngineProcess) == set(CAPABILITIES)
    assert remotes(EngineProcess) == {name for name, capability in CAPABILITIES.items()
                                      if capability.protocol in (Backend, Comparing)}  # a remote server's client
    hand_written = {name for klass in (EngineProcess, LocalEngineProcess) for name, value in vars(klass).items()
                    if name in CAPABILITIES and not isinstance(value, Remote)}
    assert hand_written == set()


def test_no_module_reads_a_message_by_position():
    """Messages between the app and its engine are typed (`engine/link.py`): nothing reads one as `message[1]`, the
    untyped envelope that once sent a call's answer to the wrong table."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                    and node.value.id in ("message", "envelope") and isinstance(node.slice, ast.Constant)
                    and isinstance(node.slice.value, int)):
                found.append(f"{module_name(path)}:{node.lineno}")
    assert found == []


STARTS_A_REPLY = {"ask", "regenerate", "continue_reply", "branch", "generate", "compare"}
THE_STARTER = ("tui_chat.workspace", "tui_chat.session")  # Workspace.start_reply, and the session it drives


def test_every_reply_starts_through_the_one_starter():
    """A message sent, Ctrl+R, F8, a branch from the inspector, a held message after a load, the lab's columns, and
    `run`'s prompts and `--compare`: each asks `Workspace.start_reply`, which waits for a load in flight and
    records the model. Five entry points once each checked that by hand, and a sixth would forget. (`serve`
    answers its clients through the engine's slots, the engine process calls its backend: not the chat's.)"""
    found = []
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        if name in THE_STARTER or within(name, "tui_chat.engine") or within(name, "tui_chat.serve"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            called = node.func if isinstance(node, ast.Call) else None
            taken = node if isinstance(node, ast.Attribute) and node.attr in ("generate", "compare") else None
            for attribute in (called, taken):
                if (isinstance(attribute, ast.Attribute) and attribute.attr in STARTS_A_REPLY
                        and not (isinstance(attribute.value, ast.Name) and attribute.value.id == "args")):  # --compare
                    found.append(f"{name}:{node.lineno} .{attribute.attr}")
    assert found == []


def test_the_server_speaks_to_an_engine_never_a_backend():
    """`serve` answers HTTP over whatever `Serving` engine it is given (the engine process): it knows no backend,
    nor the process that holds one."""
    for wing in (LOCAL_WING, "tui_chat.engine.openai", "tui_chat.engine.process", "tui_chat.engine.host",
                 "tui_chat.engine.link"):
        assert offenders("tui_chat.serve", wing) == []


def test_the_engine_reaches_the_hub_only_through_its_factory():
    assert offenders("tui_chat.engine", "tui_chat.hub", allowed=("tui_chat.engine.factory",)) == []


def test_the_hub_never_imports_the_engine():
    assert offenders("tui_chat.hub", "tui_chat.engine") == []


@pytest.mark.parametrize("layer", WIDGETS)
def test_widgets_never_import_screens(layer):
    """A widget posts a message; the screen that handles it opens the next screen."""
    assert offenders(layer, "tui_chat.ui.screens") == []
    assert offenders(layer, "tui_chat.ui.chat") == []


@pytest.mark.parametrize("layer", WIDGETS)
def test_no_widget_imports_the_workspace(layer):
    """Attributes down, messages up: a widget is given what it shows and says what the user did; the screen's rooms
    change the workspace and the chat."""
    assert offenders(layer, "tui_chat.workspace") == []


def test_no_widget_changes_the_chat():
    """A widget reads the session it shows; what changes the chat (a branch switched, turns taken off, the
    thinking switch, a reply started) is a room's of the screen, on a message the widget posts."""
    from tui_chat.session import ChatSession

    reading = {"why_not_branch", "why_not_continue", "why_not_reply", "position", "messages", "spent", "lab_messages",
               "settings"}
    changing = {name for name in vars(ChatSession) if not name.startswith("_") and callable(getattr(ChatSession, name))
                and name not in reading}
    calls = []
    for path in sorted([*(PACKAGE / "ui" / "widgets").glob("*.py"), *(PACKAGE / "ui" / "panel").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in changing
                    and ast.unparse(node.func.value).endswith("session")):
                calls.append(f"{path.name}:{node.lineno} {ast.unparse(node.func)}")
    assert calls == []


ROOM_MODULES = sorted(path for path in (PACKAGE / "ui" / "chat").glob("*.py")
                      if path.stem not in ("__init__", "screen", "room"))  # room.py: what every room is given


def test_every_chat_key_is_handled_in_a_room_of_ui_chat():
    """keys.py is the one table of the chat's keys; each one's action is the screen's one `room(name, action, …)`,
    which runs a method of that room under ui/chat/ (not the App's, not the screen's, not a widget's by name)."""
    from textual.actions import parse

    from tui_chat.ui.chat.screen import ROOMS
    from tui_chat.ui.keys import CHAT_KEYS

    elsewhere = []
    for binding in CHAT_KEYS:
        namespace, action, arguments = parse(binding.action)
        room = ROOMS.get(str(arguments[0])) if action == "room" and not namespace and len(arguments) > 1 else None
        if (room is None or not callable(getattr(room, f"action_{arguments[1]}", None))
                or not within(room.__module__, "tui_chat.ui.chat")):
            elsewhere.append(f"{binding.key}: {binding.action}")
    assert elsewhere == []


def test_every_message_the_screen_routes_has_its_handler_in_its_room():
    """The screen passes a widget's or a room's message to the room `ROUTES` names, as Textual names its handler
    (`UserMessage.Edit` → `on_user_message_edit`): a handler renamed or moved would be silently skipped."""
    from tui_chat.ui.chat.screen import ROOMS, ROUTES

    missing = [f"{message.__qualname__} → {room}" for message, room in ROUTES.items()
               if not callable(getattr(ROOMS[room], message.handler_name, None))]
    assert missing == []


def test_the_chat_screen_is_small_across_everything_it_is_built_from():
    """Counted across every class of tui_chat it is built on (Textual's own aside), so that a room mixed in as a
    base counts: its rooms are collaborators it makes and gives a context, never its bases."""
    from tui_chat.ui.chat.room import Room
    from tui_chat.ui.chat.screen import ChatScreen

    ours = [cls for cls in ChatScreen.__mro__ if within(cls.__module__, "tui_chat")]
    methods = [f"{cls.__name__}.{name}" for cls in ours for name, value in vars(cls).items()
               if isinstance(value, (FunctionType, property, staticmethod, classmethod))]
    assert len(methods) <= MAX_SCREEN_METHODS, methods
    assert [cls.__name__ for cls in ours if issubclass(cls, Room)] == []


def room_classes() -> dict[str, list[ast.ClassDef]]:
    """Each room module's classes, by the module's name."""
    return {path.stem: [node for node in ast.parse(path.read_text(encoding="utf-8")).body
                        if isinstance(node, ast.ClassDef)] for path in ROOM_MODULES}


def members(room: ast.ClassDef) -> set[str]:
    """What a room defines: its methods, its class attributes and what it sets on `self`."""
    found = {item.name for item in room.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found |= {target.id for item in room.body for target in getattr(item, "targets", [getattr(item, "target", None)])
              if isinstance(target, ast.Name)}
    return found | {node.attr for node in ast.walk(room) if isinstance(node, ast.Attribute) and isinstance(
                    node.ctx, ast.Store) and isinstance(node.value, ast.Name) and node.value.id == "self"}


def test_no_room_imports_or_calls_another():
    """Rooms reach each other by messages (room.py's, routed by the screen): a room's module imports no other
    room's, a room reaches only what it defines and its context (`self.chat`: never a screen it shares with the
    others), and it names no method or attribute that only another room defines."""
    classes = room_classes()
    defined = {stem: set().union(*(members(room) for room in rooms)) for stem, rooms in classes.items()}
    modules = {f"tui_chat.ui.chat.{stem}" for stem in classes}
    found = [f"{module} imports {name}" for module in sorted(modules) for name in MODULES[module]
             if any(within(name, other) for other in modules - {module})]
    for stem, rooms in classes.items():
        others = set().union(*(names for other, names in defined.items() if other != stem)) - defined[stem]
        for room in rooms:
            own = members(room) | {"chat"}
            found += [f"{stem}.py:{node.lineno} {ast.unparse(node)}" for node in ast.walk(room)
                      if isinstance(node, ast.Attribute) and (node.attr in others or (
                          isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr not in own))]
    assert found == []


def test_the_app_holds_only_app_concerns():
    """Themes, the palette, notifications, crashes: ChatApp does nothing of a chat's."""
    [app] = [node for node in ast.parse((PACKAGE / "ui" / "app.py").read_text(encoding="utf-8")).body
             if isinstance(node, ast.ClassDef) and node.name == "ChatApp"]
    methods = [item.name for item in app.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert len(methods) <= MAX_APP_METHODS, methods


def test_the_app_never_reaches_into_a_screens_widgets():
    """The palette's commands post messages to the chat screen (`PaletteChoice`) or run its actions: the screen's
    widgets are its own to query and change."""
    tree = ast.parse((PACKAGE / "ui" / "app.py").read_text(encoding="utf-8"))
    reached = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute)
               and node.attr in ("query", "query_one", "query_one_optional", "query_children")]
    assert reached == []


def test_the_gguf_reader_is_a_leaf():
    """The hub and the engine both read GGUF headers here: it imports only the standard library."""
    assert offenders("tui_chat.gguf", "tui_chat") == []
    assert sorted(name for name in MODULES["tui_chat.gguf"]
                  if name.split(".")[0] not in sys.stdlib_module_names | {"__future__"}) == []


def screen_classes() -> list[tuple[str, ast.ClassDef]]:
    """Every class in ui/screens/ and ui/chat/ built on a Textual screen (directly, or through a dialog or the chat
    screen's stage), and every room of the chat screen."""
    found: list[tuple[str, ast.ClassDef]] = []
    for path in sorted([*(PACKAGE / "ui" / "screens").glob("*.py"), *(PACKAGE / "ui" / "chat").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            bases = [ast.unparse(base).split("[")[0] for base in getattr(node, "bases", ())]
            if isinstance(node, ast.ClassDef) and any(base.endswith(("Screen", "Dialog", "Stage", "Room"))
                                                      for base in bases):
                found.append((path.name, node))
    return found


def test_no_screen_class_has_more_than_30_methods():
    """Properties and handlers count too: each is something the screen does (a room is counted alone)."""
    assert screen_classes(), "no screens found"
    heavy = [f"{name}: {node.name} has {count} methods"
             for name, node in screen_classes()
             if (count := sum(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) for item in node.body))
             > MAX_SCREEN_METHODS]
    assert heavy == []


def test_no_ui_file_is_longer_than_400_lines():
    long = [f"{path.relative_to(PACKAGE)}: {lines} lines" for path in sorted((PACKAGE / "ui").rglob("*.py"))
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_UI_LINES]
    assert long == []


def test_no_import_cycles():
    """Strongly connected groups of modules (Tarjan): each must be one module alone."""
    graph = {module: {name for name in names if name in MODULES and name != module}
             for module, names in MODULES.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in graph:
        if module not in index:
            visit(module)
    assert cycles == []


def test_the_ui_runs_without_llama_cpp_and_the_engine_without_textual():
    """The same, as Python sees it: importing every UI module loads no llama_cpp, and every engine and hub
    module no Textual."""
    ui = [m for m in MODULES if within(m, "tui_chat.ui")]
    below = [m for m in MODULES if any(within(m, layer) for layer in TEXTUAL_FREE)]
    code = (f"import importlib, sys\nfor m in {ui!r}: importlib.import_module(m)\n"
            "assert 'llama_cpp' not in sys.modules, 'llama_cpp'\n"
            f"for m in {below!r}: importlib.import_module(m)\n")
    textual_free = (f"import importlib, sys\nfor m in {below!r}: importlib.import_module(m)\n"
                    "assert not [m for m in sys.modules if m.startswith('textual')], 'textual'\n")
    for script in (code, textual_free):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr


def test_the_command_line_and_the_server_backend_load_neither_textual_nor_llama_cpp():
    """`tui-chat run --remote …` talks HTTP only: starting it, or opening a server, loads no native library
    and no UI (each costs start-up time on every command)."""
    script = ("import sys, tui_chat.cli, tui_chat.engine.openai\n"
              "loaded = [m for m in sys.modules if m.split('.')[0] in ('llama_cpp', 'textual')]\n"
              "assert not loaded, loaded\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("argv", "commands"),
                         [([], []), (["--help"], []), (["--version"], ["tui_chat.commands.info"])])
def test_the_entry_point_help_and_version_load_no_heavy_library_and_no_other_command(argv, commands):
    """`tui-chat --help` and `--version` answer at once: importing `tui_chat.cli` and answering either loads
    neither Textual, llama.cpp, Jinja nor numpy, and no command's module but the one answering (each comes in
    when its command runs)."""
    script = ("import sys\nfrom tui_chat.cli import main\n"
              f"if {argv!r}:\n"
              "    try:\n"
              f"        main({argv!r})\n"
              "    except SystemExit:\n"
              "        pass\n"
              "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'textual', 'llama_cpp', 'jinja2', 'numpy'})\n"
              "commands = sorted(m for m in sys.modules if m.startswith('tui_chat.commands.') and m != "
              "'tui_chat.commands.common')\n"
              f"assert not heavy and commands == {commands!r}, (heavy, commands)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_the_llama_wing_is_composed_not_a_tower():
    """The llama.cpp backend owns its worker, its loaded model and the transcript; a reply, the sampling lab and the
    serving slots are handed the backend (its `Host` side), never built on it: no class of the wing subclasses the
    backend, and the lab and the slots are classes of their own."""
    from tui_chat.engine.local.lab import Lab
    from tui_chat.engine.local.llama import LlamaBackend
    from tui_chat.engine.local.slots import Slots

    towers = [f"{path.name}: {node.name}" for path in (PACKAGE / "engine" / "local").glob("*.py")
              for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
              and any(isinstance(base, ast.Name) and base.id == "LlamaBackend" for base in node.bases)]
    assert towers == []
    assert [cls.__mro__ for cls in (LlamaBackend, Lab, Slots)] == [(cls, object) for cls in (LlamaBackend, Lab, Slots)]
