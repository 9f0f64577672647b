"""The token inspector: at one token of a reply, what the model could have written instead, how
likely each was, which of them today's settings would keep (and which an output format forbade), and a
branch from any of them. Asked, it recomputes the position in the model: the X-ray of the draw (`x`)
and the exact probability of any word typed in its field."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from ...engine.base import FINAL_EVENTS, Candidate, Error, Event, LoadProgress, PoolCut, Token, WordProbability, XRay
from ...engine.params import SamplingParams
from ...engine.pool import kept_by
from ...probe import TokenProbe
from ...safetext import quoted, screen_safe
from ..widgets.fields import TextField
from ..widgets.xray import bar, grammar_text, word_text, xray_text
from .dialog import Dialog

CONTEXT_CHARS = 48


@dataclass(frozen=True, slots=True)
class BranchChoice:
    """Continue the reply from token `index`, written as `candidate` instead."""

    index: int
    candidate: Candidate


def pool_line(pool: PoolCut | None) -> str:
    if pool is None:
        return "Pool at this token: not recorded (the token was chosen, not drawn)"
    if pool == PoolCut(1, 1, 1):
        return "When it was drawn only the likeliest candidate was left (temperature 0 or top-k 1): no draw"
    counts = [f"{name} {'more' if count is None else f'{count:,}'}" for name, count in
              (("top-k", pool.top_k), ("top-p", pool.top_p), ("min-p", pool.min_p))]
    return "Candidates the settings kept when it was drawn: " + " → ".join(counts)


def candidate_lines(token: Token, params: SamplingParams) -> list[Text]:
    """One line a candidate: rank, text, bar, probability, cumulative probability, kept or cut now; an
    alternative the output format's grammar forbade is listed, marked `forbidden`."""
    keep = kept_by([c.prob for c in token.top], params) if token.top else 0
    lines, cumulative = [], 0.0
    for rank, candidate in enumerate(token.top):
        cumulative += candidate.prob
        chosen = token.is_candidate(candidate)
        forbidden = candidate.allowed is False
        line = Text(f"{rank + 1}.".ljust(4))  # no leading blank: option lists trim it
        line.append("▶ " if chosen else "  ", style="bold")
        line.append(f"{quoted(candidate.text):<16.16}", style="bold" if chosen else "dim strike" if forbidden else "")
        line.append(f" {bar(candidate.prob)} ", style="dim" if forbidden or rank >= keep else "green")
        line.append(f"{candidate.prob:6.1%}  Σ {cumulative:6.1%}  ")
        if forbidden:
            line.append("forbidden", style="bold red")
        else:
            line.append("kept" if rank < keep else "cut", style="" if rank < keep else "dim")
        lines.append(line)
    return lines


class InspectorScreen(Dialog[BranchChoice | None]):
    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close"),
        Binding("left", "move(-1)", "Previous token"),
        Binding("right", "move(1)", "Next token"),
        Binding("x", "xray", "X-ray"),
    ]
    DEFAULT_CSS = """
    InspectorScreen > VerticalScroll { width: 76; max-height: 95%; }
    InspectorScreen #context { margin: 0 0 1 0; }
    InspectorScreen #keys { dock: bottom; background: $surface; }  /* seen on a short terminal too */
    InspectorScreen OptionList { height: auto; max-height: 22; margin: 1 0 0 0; }
    InspectorScreen #asked, InspectorScreen #xray { height: auto; display: none; }
    InspectorScreen #xray { margin: 1 0 0 0; }
    InspectorScreen #asked.-shown, InspectorScreen #xray.-shown { display: block; }
    InspectorScreen #ask { margin: 1 0 0 0; }
    """

    def __init__(self, tokens: Sequence[Token], text: str, index: int, params: SamplingParams,
                 cannot_branch: str | None, probe: TokenProbe | None = None) -> None:
        super().__init__()
        self.tokens = tokens
        self.text = text
        self.index = index
        self.params = params
        self.cannot_branch = cannot_branch
        self.probe = probe
        self.xray_on = False  # once asked, the X-ray follows the picked token
        self.asked = ""  # the word asked about; it is asked again at each token

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = "Token inspector"
            yield Static(id="context")
            yield Static(id="facts")
            yield OptionList(id="candidates")
            yield Static(id="asked")
            yield TextField(placeholder="Ask about a word: type it, Enter", compact=True, id="ask")
            yield Static(id="xray")
            yield Static(id="pool", classes="hint")
            yield Static(Text("↑/↓ pick · Enter branches the reply from here with it · ←/→ other tokens · "
                              "x X-ray · Tab asks about a word · Esc closes"), classes="hint", id="keys")

    def on_mount(self) -> None:
        self._show()
        self.query_one(OptionList).focus()

    def _show(self) -> None:
        token = self.tokens[self.index]
        self.query_one(VerticalScroll).border_title = f"Token {self.index + 1} of {len(self.tokens)}"
        self.query_one("#context", Static).update(self._surroundings(token))
        facts = Text(f"{quoted(token.piece)}  ") if not token.special else Text.assemble(
            (screen_safe(token.special), "dim"), " not text: a special token, left out of the reply's text  ")
        if token.prob is not None:
            facts.append_text(Text.assemble((f"p = {token.prob:.1%}", "bold"),
                                            " under the model's raw distribution (before any setting)"))
        if token.forced:
            facts.append(" · chosen by you: the branch starts here", style="italic")
        if token.drafted:
            facts.append(" · drafted: guessed ahead, and the model's own draw kept it", style="italic")
        elif token.rejected:
            facts.append(f" · the correction: the draft guessed {quoted(token.rejected)}, the model drew this",
                         style="italic")
        facts.append_text(grammar_text(token.grammar))
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
        self.query_one("#asked", Static).set_class(bool(self.asked), "-shown")
        if self.asked:
            self._ask(self.asked)
        if self.xray_on:
            self._xray()

    def _surroundings(self, token: Token) -> Text:
        before = "".join(t.piece for t in self.tokens[: self.index])
        after = "".join(t.piece for t in self.tokens[self.index + 1 :])
        out = Text("…" + screen_safe(before[-CONTEXT_CHARS:]).replace("\n", "⏎ "), style="dim")
        if token.special:
            out.append(screen_safe(token.special), style="reverse dim")
        else:
            out.append(screen_safe(token.piece).replace("\n", "⏎") or "∅", style="reverse bold")
        out.append(screen_safe(after[: CONTEXT_CHARS // 2]).replace("\n", "⏎ ") + "…", style="dim")
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
        elif candidate.allowed is False:
            self.notify("The output format forbids that token here: a branch from it would break the format.",
                        severity="warning", timeout=4)
        elif token.is_candidate(candidate):
            self.notify("That is the token already there: pick another to branch.", timeout=3)
        else:
            self.dismiss(BranchChoice(self.index, candidate))

    # --- asking the model: the X-ray and any word ------------------------------------------------

    def _why_not(self) -> str | None:
        return "No model can be asked about this reply." if self.probe is None else self.probe.why_not()

    def action_xray(self) -> None:
        self.xray_on = not self.xray_on
        self.query_one("#xray", Static).set_class(self.xray_on, "-shown")
        if self.xray_on:
            self._xray()

    def _xray(self) -> None:
        panel = self.query_one("#xray", Static)
        reason = self._why_not()
        if reason is None and self.tokens[self.index].forced:
            reason = "You chose this token: it was not drawn, so there is no draw to X-ray."
        if reason is not None:
            panel.update(Text(f"X-ray: {reason}", style="italic"))
            return
        panel.update(Text("X-ray: recomputing this position…", style="dim"))
        self._recompute("xray", self.index, "")

    @on(Input.Submitted, "#ask")
    def _asked(self, event: Input.Submitted) -> None:
        event.stop()
        self.asked = event.value
        self.query_one("#asked", Static).set_class(True, "-shown")
        self._ask(event.value)

    def _ask(self, text: str) -> None:
        shown = self.query_one("#asked", Static)
        reason = self._why_not() or ("" if text else "Type a word or phrase, then Enter.")
        if reason:
            shown.update(Text(reason, style="italic"))
            return
        shown.update(Text(f"Asking the model about {quoted(text)}…", style="dim"))
        self._recompute("word", self.index, text)

    @work(thread=True, group="probe")
    def _recompute(self, kind: str, index: int, text: str) -> None:
        """On a worker thread: the engine answers between two tokens when a reply is being written."""
        probe = self.probe
        assert probe is not None, "asked only when _why_not() found no reason"
        stream = probe.xray(index) if kind == "xray" else probe.word(index, text)
        for event in stream:
            if isinstance(event, LoadProgress):  # its engine process had died: the model loads again first
                self.app.call_from_thread(self._loading_again, kind, index, text, event.stage)
            elif isinstance(event, FINAL_EVENTS):
                self.app.call_from_thread(self._answered, kind, index, text, event)

    def _loading_again(self, kind: str, index: int, text: str, stage: str) -> None:
        if self.is_attached and index == self.index and (kind == "xray" or text == self.asked):
            shown = self.query_one("#xray" if kind == "xray" else "#asked", Static)
            shown.update(Text(f"{'X-ray' if kind == 'xray' else quoted(text)}: {screen_safe(stage)}", style="dim"))

    def _answered(self, kind: str, index: int, text: str, result: Event) -> None:
        if not self.is_attached or index != self.index or (kind == "word" and text != self.asked):
            return  # the user moved on
        if kind == "xray" and self.xray_on and self.probe is not None:
            shown = self.query_one("#xray", Static)
            token = self.tokens[index]
            note = self.probe.settings(token)[1]
            shown.update(xray_text(result, note, token.prob) if isinstance(result, XRay)
                         else self._failed("X-ray", result))
        elif kind == "word":
            shown = self.query_one("#asked", Static)
            top = self.tokens[index].top
            shown.update(word_text(result, top) if isinstance(result, WordProbability) else self._failed(text, result))
        else:
            return
        self.call_after_refresh(shown.scroll_visible)  # on a short terminal the answer lands below the fold

    @staticmethod
    def _failed(what: str, result: Event) -> Text:
        message = result.message if isinstance(result, Error) else "no answer"
        return Text(f"{screen_safe(what)}: {screen_safe(message)}", style="italic")
