"""The token inspector: at one token of a reply, what the model could have written instead, how
likely each was, which of them today's settings would keep, and a branch from any of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from ...engine.base import Candidate, PoolCut, Token
from ...engine.params import SamplingParams
from ...engine.pool import kept_by
from ...safetext import terminal_safe

BAR_WIDTH = 16
CONTEXT_CHARS = 48


@dataclass(frozen=True, slots=True)
class BranchChoice:
    """Continue the reply from token `index`, written as `candidate` instead."""

    index: int
    candidate: Candidate


def shown_token(text: str) -> str:
    """A token as a quoted literal, so spaces and line breaks are visible."""
    escaped = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    return f'"{terminal_safe(escaped)}"'


def bar(prob: float, width: int = BAR_WIDTH) -> str:
    eighths = round(prob * width * 8)
    full, part = divmod(eighths, 8)
    return ("█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "")).ljust(width)


def pool_line(pool: PoolCut | None) -> str:
    if pool is None:
        return "Pool at this token: not recorded (the token was chosen, not drawn)"
    if pool == PoolCut(1, 1, 1):
        return "When it was drawn only the likeliest candidate was left (temperature 0 or top-k 1): no draw"
    counts = [f"{name} {'more' if count is None else f'{count:,}'}" for name, count in
              (("top-k", pool.top_k), ("top-p", pool.top_p), ("min-p", pool.min_p))]
    return "Candidates the settings kept when it was drawn: " + " → ".join(counts)


def candidate_lines(token: Token, params: SamplingParams) -> list[Text]:
    """One line a candidate: rank, text, bar, probability, cumulative probability, kept or cut now."""
    keep = kept_by([c.prob for c in token.top], params) if token.top else 0
    lines, cumulative = [], 0.0
    for rank, candidate in enumerate(token.top):
        cumulative += candidate.prob
        chosen = token.is_candidate(candidate)
        line = Text(f"{rank + 1}.".ljust(4))  # no leading blank: option lists trim it
        line.append("▶ " if chosen else "  ", style="bold")
        line.append(f"{shown_token(candidate.text):<16.16}", style="bold" if chosen else "")
        line.append(f" {bar(candidate.prob)} ", style="green" if rank < keep else "dim")
        line.append(f"{candidate.prob:6.1%}  Σ {cumulative:6.1%}  ")
        line.append("kept" if rank < keep else "cut", style="" if rank < keep else "dim")
        lines.append(line)
    return lines


class InspectorScreen(ModalScreen[BranchChoice | None]):
    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close"),
        Binding("left", "move(-1)", "Previous token"),
        Binding("right", "move(1)", "Next token"),
    ]
    DEFAULT_CSS = """
    InspectorScreen { align: center middle; }
    InspectorScreen > Vertical {
        width: 76; max-width: 100%; height: auto; max-height: 95%;
        border: round $accent; background: $surface; padding: 0 1;
    }
    InspectorScreen #context { margin: 0 0 1 0; }
    InspectorScreen .hint { color: $text-muted; }
    InspectorScreen OptionList { height: auto; max-height: 22; margin: 1 0; }
    """

    def __init__(self, tokens: Sequence[Token], text: str, index: int, params: SamplingParams,
                 cannot_branch: str | None) -> None:
        super().__init__()
        self.tokens = tokens
        self.text = text
        self.index = index
        self.params = params
        self.cannot_branch = cannot_branch

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Token inspector"
            yield Static(id="context")
            yield Static(id="facts")
            yield OptionList(id="candidates")
            yield Static(id="pool", classes="hint")
            yield Static(Text("↑/↓ pick · Enter branches the reply from here with it · ←/→ other tokens · Esc closes"),
                         classes="hint")

    def on_mount(self) -> None:
        self._show()
        self.query_one(OptionList).focus()

    def _show(self) -> None:
        token = self.tokens[self.index]
        self.query_one(Vertical).border_title = f"Token {self.index + 1} of {len(self.tokens)}"
        self.query_one("#context", Static).update(self._surroundings(token))
        facts = Text(f"{shown_token(token.piece)}  ")
        if token.prob is not None:
            facts.append_text(Text.assemble((f"p = {token.prob:.1%}", "bold"),
                                            " under the model's raw distribution (before any setting)"))
        if token.forced:
            facts.append(" · chosen by you: the branch starts here", style="italic")
        self.query_one("#facts", Static).update(facts)
        candidates = self.query_one(OptionList)
        candidates.clear_options()
        candidates.add_options([Option(line, id=str(rank)) for rank, line in
                                enumerate(candidate_lines(token, self.params))])
        chosen = next((rank for rank, c in enumerate(token.top) if token.is_candidate(c)), 0)
        candidates.highlighted = chosen if token.top else None
        self.query_one("#pool", Static).update(Text(
            f"{pool_line(token.pool)}\nKept/cut: what the current settings would keep of these "
            f"(temperature {self.params.temperature:g}, top-k {self.params.top_k}, "
            f"top-p {self.params.top_p:g}, min-p {self.params.min_p:g})"
        ))

    def _surroundings(self, token: Token) -> Text:
        before = "".join(t.piece for t in self.tokens[: self.index])
        after = "".join(t.piece for t in self.tokens[self.index + 1 :])
        out = Text("…" + terminal_safe(before[-CONTEXT_CHARS:]).replace("\n", "⏎ "), style="dim")
        out.append(terminal_safe(token.piece).replace("\n", "⏎") or "∅", style="reverse bold")
        out.append(terminal_safe(after[: CONTEXT_CHARS // 2]).replace("\n", "⏎ ") + "…", style="dim")
        return out

    def action_move(self, step: int) -> None:
        self.index = max(0, min(self.index + step, len(self.tokens) - 1))
        self._show()

    @on(OptionList.OptionSelected)
    def _branch(self, event: OptionList.OptionSelected) -> None:
        token = self.tokens[self.index]
        candidate = token.top[event.option_index]
        if self.cannot_branch:
            self.notify(self.cannot_branch, severity="warning", timeout=4, markup=False)
        elif token.is_candidate(candidate):
            self.notify("That is the token already there: pick another to branch.", timeout=3)
        else:
            self.dismiss(BranchChoice(self.index, candidate))
