"""One conversation, owned in one place: what was said, every branch of the latest reply, the reply
being written and its record in the history. No Textual here: the chat screen renders a session and
sends it commands, and `tui-chat run` drives the same object.

The flow: a command (`ask`, `regenerate`, `branch`) makes a `Request` and starts it on the backend;
the backend's events come back through `take`, which updates the conversation and says what changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

from .engine.base import (
    Candidate,
    Done,
    EngineDeath,
    Error,
    Event,
    LoadProgress,
    Message,
    Metrics,
    PromptProgress,
    Request,
    StopReason,
    Stream,
    Token,
    ToolActivity,
    ToolCall,
    TurnMetrics,
    written,
)
from .engine.context import left_out
from .engine.formats import TEXT, OutputFormat
from .engine.params import LiveParams
from .history import Conversation, HistoryError, ReplyWriter, StoredMessage, ToolSwitches, title_from
from .recording import SavedChat, Saving, Settings
from .safetext import quoted
from .wording import STOP_LABELS, progress_line, reply_footer, stored_footer, thinking_line, wait_note

if TYPE_CHECKING:
    from .lab import Column
    from .tools.loop import ToolUse

T = TypeVar("T")
Generate = Callable[[Request], Stream]



@runtime_checkable
class Reply(Protocol):
    """A reply as the views read it, the same whether it is being written (`Writing`) or finished (`Branch`)."""

    @property
    def text(self) -> str: ...
    @property
    def reasoning(self) -> str: ...  # its thinking, before the answer
    @property
    def tokens(self) -> list[Token]: ...
    @property
    def answer_from(self) -> int: ...  # tokens[:answer_from] are the thinking's (the markers included)
    @property
    def thought(self) -> str: ...  # the thinking's header: `thinking_line` of it
    @property
    def footer(self) -> str | None: ...  # how it ended; None while it is written
    @property
    def metrics(self) -> TurnMetrics | None: ...  # the engine's figures (the latest, while it is written)
    @property
    def tool_calls(self) -> list[ToolCall]: ...  # the tools it called, in order (the latest state of each)


@dataclass(eq=False)
class Branch:
    """One version of a reply: regenerated, or branched from a token of another (`cut`: where). A `Reply`."""

    text: str
    footer: str
    _: KW_ONLY  # the rest by name: a reply written, reopened or kept from the lab is built the same way
    tokens: list[Token] = field(default_factory=list)
    cut: int | None = None
    message_id: int | None = None  # in the history
    stop_reason: StopReason | None = None  # how it ended, when it was written in this session
    prompt_ids: tuple[int, ...] = ()  # all the model read before the reply (Done.prompt_ids), for the X-ray
    model: str = ""  # the model that wrote it (ChatSession.model): only that one can recompute its positions
    reasoning: str = ""  # its thinking, before the answer (`text`)
    thought: str = ""  # `thinking_line` of it
    answer_from: int = 0  # tokens[:answer_from] are the thinking's (the markers included)
    metrics: TurnMetrics | None = None  # its figures, kept (None: cut short, or reopened without them)
    tool_calls: list[ToolCall] = field(default_factory=list)  # the tools it called before its answer

    @property
    def context_tokens(self) -> int:
        """The context the model held after it (its prompt and itself); 0: not known."""
        return self.metrics.context_tokens if self.metrics is not None else 0


@dataclass(eq=False)
class Turn:
    """A question and the replies to it; one branch is shown, and the chat goes on from it."""

    question: str
    branches: list[Branch] = field(default_factory=list)
    active: int = 0
    question_id: int | None = None  # in the history
    parent_id: int | None = None  # the message the question followed

    @property
    def reply(self) -> Branch | None:
        return self.branches[self.active] if self.branches else None


@dataclass(eq=False)
class Writing:
    """The reply being written: its stream, its tokens so far and its record. A `Reply`, with no footer yet."""

    turn: Turn
    stream: Stream
    forced: list[Token]  # a branch's given tokens, with what was known of them
    writer: ReplyWriter | None
    how: str = "branched"  # or "continued": what the footer says of the given tokens
    tokens: list[Token] = field(default_factory=list)
    text: str = ""
    reasoning: str = ""
    answer_from: int = 0  # tokens so far that belong to the thinking
    thinking_span: tuple[float, float] | None = None  # the engine's clock at the first and latest of them
    visible: bool = False
    metrics: TurnMetrics | None = None  # the latest figures the engine sent
    tool_calls: list[ToolCall] = field(default_factory=list)  # as they go: asked, running, done
    started: float = field(default_factory=time.perf_counter)  # the request's time: TTFT is counted from it too
    model: str = ""  # the model it is written by: the chat's when it started, whatever loads meanwhile

    def thinking_figures(self) -> dict[str, Any]:
        """The thinking so far, as `thinking_line` reads it (nothing before it starts)."""
        if self.thinking_span is None:
            return {}
        first, last = self.thinking_span
        return {"thinking_s": last - first, "reasoning_tokens": self.answer_from}

    @property
    def thought(self) -> str:
        """Its time and tokens so far."""
        return thinking_line(self.thinking_figures(), ongoing=True) or "thinking…"

    @property
    def footer(self) -> None:
        return None

    @property
    def is_branch(self) -> bool:
        return bool(self.turn.branches)

    def held_line(self) -> str:
        """Streaming off: the line that shows the reply being written while it is held back."""
        return f"Writing, streaming off: {len(self.tokens):,} tokens · {time.perf_counter() - self.started:.1f} s"


@dataclass(frozen=True, slots=True)
class Ending:
    """How a reply ended, for the views: `finished` (a new branch), `failed` (cut short but kept),
    `taken_back` (nothing was written: the turn is gone, its question goes back to the box), or
    `restored` (a new branch wrote nothing: the one before it is shown again)."""

    kind: Literal["finished", "failed", "taken_back", "restored"]
    message: str = ""  # what to tell the user (an error, turns left out)
    died: EngineDeath | None = None  # the engine process died under it: each front-end says so in its words
    done: Done | None = None
    waited_s: float = 0.0  # from the request to the end of the reply


@dataclass(slots=True)
class Update:
    """What one batch of events changed in the reply being written."""

    text: str = ""  # newly visible text
    reasoning: str = ""  # newly visible thinking
    status: str | None = None  # prompt-reading progress, "" once text flows
    metrics: TurnMetrics | None = None
    versions: list[tuple[int, int]] = field(default_factory=list)  # (settings version, tokens so far) as it changed
    tools: bool = False  # a tool call was asked, started or ended
    ending: Ending | None = None

    def applied_from(self, version: int) -> int | None:
        """The token from which settings `version` (or newer) were in use, if they were in this batch."""
        return next((count for used, count in self.versions if used >= version), None)


class ChatSession:
    """`warn` tells the user something once (a history that stopped saving, turns left out).
    `output_format` belongs to the conversation (saved with it); `streaming` off holds each reply back
    until it is complete (the views' business; the footer compares the wait); `xray` records each
    token's stages (costs a pass of the chain per token)."""

    def __init__(self, live: LiveParams, *, saving: Saving | None = None, system_prompt: str = "", model: str = "",
                 top_logprobs: int = 0, warn: Callable[[str], None] = lambda _message: None,
                 output_format: OutputFormat = TEXT, streaming: bool = True, xray: bool = False,
                 thinking: bool = True) -> None:
        self.live = live
        self.system_prompt = system_prompt
        self.model = model  # what opens this chat's model again
        self.top_logprobs = top_logprobs
        self.output_format = output_format
        self.streaming = streaming
        self.xray = xray
        self.thinking = thinking  # the chat's thinking switch (its budget is in the sampling settings)
        self.warn = warn
        self.turns: list[Turn] = []
        self.writing: Writing | None = None
        self.saved: SavedChat | None = SavedChat(saving) if saving else None
        self.saved_title = ""  # the title in the history, for a reopened chat (it may have been renamed)
        self.tools: ToolUse | None = None  # the tools its replies may call, and who consents (tools/loop.py)
        self.tool_switches = ToolSwitches()  # those the user switched on (saved; `tools` once their servers run)

    # --- what the model sees --------------------------------------------------------------------

    def messages(self, answering: Turn | None = None) -> list[Message]:
        """The system prompt and the active path; the turn being answered ends at its question."""
        answering = answering or (self.writing.turn if self.writing else None)
        messages = [Message("system", self.system_prompt)] if self.system_prompt else []
        for turn in self.turns:
            messages.append(Message("user", turn.question))
            if turn.reply is not None and turn is not answering:
                if turn.reply.tool_calls and self.tools is not None:  # as the model wrote and read them
                    messages += self.tools.replay(turn.reply.tool_calls)
                messages.append(Message("assistant", turn.reply.text, turn.reply.reasoning))
        return messages

    @property
    def title(self) -> str:
        if self.saved_title:
            return self.saved_title
        return title_from(self.turns[0].question) if self.turns else "New chat"

    @property
    def context_tokens(self) -> int:
        """What the conversation on screen holds in the model's context, as its latest reply left it: the
        draft meter bills it with the next message (a reply taken back changes nothing)."""
        return next((turn.reply.context_tokens for turn in reversed(self.turns)
                     if turn.reply is not None and turn.reply.context_tokens), 0)

    def spent(self) -> list[TurnMetrics]:
        """The figures of every reply in this chat, its other branches too: what the panel bills as the session."""
        return [branch.metrics for turn in self.turns for branch in turn.branches if branch.metrics is not None]

    @property
    def conversation_id(self) -> int | None:
        return self.saved.id if self.saved else None

    # --- commands -------------------------------------------------------------------------------

    def ask(self, text: str, generate: Generate) -> Turn:
        """A new turn: the question is saved, its reply starts."""
        turn = self._new_turn(text)
        self._start(turn, generate)
        return turn

    def _new_turn(self, text: str) -> Turn:
        turn = Turn(text, parent_id=self.saved.last_id if self.saved else None)
        turn.question_id = self._save(lambda saved: saved.add_user(text, self.model, self.system_prompt,
                                                                   self.settings(), self.thinking))
        self.turns.append(turn)
        return turn

    def lab_messages(self, question: str) -> list[Message]:
        """What the sampling lab's columns answer: the chat up to `question` (the last turn's, or a new one)."""
        last = self.turns[-1] if self.turns else None
        if last is not None and last.question == question:
            return self.messages(answering=last)
        return [*self.messages(), Message("user", question)]

    def keep_lab(self, question: str, columns: Sequence[Column], kept: int) -> Turn:
        """A lab's columns as the replies to `question`: the last turn's when it asked it (its replies so far
        stay), else a new turn. Each is a branch, saved, its footer naming its settings; the chat goes on from
        column `kept`, whose settings become the chat's (the screen's controls follow `live`)."""
        assert self.writing is None, "the lab opens between replies"
        last = self.turns[-1] if self.turns else None
        turn = last if last is not None and last.question == question else None
        self.live.update(**columns[kept].live.snapshot()[1].as_dict())
        if turn is None:
            turn = self._new_turn(question)
        else:
            self.keep_settings()
        question_id = turn.question_id
        shown = None
        for index, column in enumerate(columns):
            done = column.done
            if done is None:
                continue
            writer = (self._save(partial(SavedChat.start_reply, parent_id=question_id, model=self.model))
                      if question_id else None)
            if writer is not None:
                self._save(partial(SavedChat.end_reply, reply=writer, final=done))
            footer = f"lab: {column.label} · " + reply_footer(done.stop_reason, done.metrics.as_dict() | {
                "stop_sequence": done.stop_sequence, "incomplete": done.incomplete})
            turn.branches.append(Branch(
                done.text, footer, tokens=list(column.tokens), message_id=writer.id if writer else None,
                stop_reason=done.stop_reason, prompt_ids=done.prompt_ids, model=self.model, reasoning=done.reasoning,
                thought=thinking_line(done.metrics.as_dict()), answer_from=done.answer_from, metrics=done.metrics))
            if index == kept:
                shown = len(turn.branches) - 1
        if shown is not None:
            self.switch(shown)
        return turn

    def keep_settings(self) -> None:
        """Save the settings in use now as this chat's (the screen calls it as they change, debounced)."""
        self._save(lambda saved: saved.keep_settings(self.settings()))

    def settings(self) -> Settings:
        """What is saved with the chat besides its messages: sampling, output format, tools."""
        return self.live.snapshot()[1], self.output_format, self.tool_switches

    def regenerate(self, generate: Generate) -> Turn:
        """Another reply to the last question; the one before stays as a branch."""
        turn = self.turns[-1]
        self._start(turn, generate)
        return turn

    def branch(self, index: int, candidate: Candidate, generate: Generate) -> Turn:
        """Cut the shown reply at token `index`, put `candidate` there and let the model go on from it.
        The engine rewinds its cache to the cut, so only the new token is read."""
        turn = self.turns[-1]
        assert turn.reply is not None, "why_not_branch: only an answered turn is branched"
        original = turn.reply.tokens[index]
        given = replace(original, token_id=candidate.token_id, text=candidate.text, piece=candidate.text,
                        prob=candidate.prob, forced=True)
        self._start(turn, generate, [*turn.reply.tokens[:index], given])
        return turn

    def switch(self, index: int) -> None:
        """Show another branch of the last reply; the chat goes on from it."""
        turn = self.turns[-1]
        turn.active = index
        message_id = turn.branches[index].message_id
        if message_id is not None:
            self._save(lambda saved: saved.choose(message_id))

    def position(self, turn: Turn) -> int | None:
        """Where `turn` is in the conversation; None once it left (a key pressed twice, a message's widget
        acting late), and then every command on it does nothing."""
        return next((index for index, held in enumerate(self.turns) if held is turn), None)

    def rewind(self, turn: Turn) -> list[Turn]:
        """Take `turn` and the ones after it off the conversation, to edit its question: the next message
        follows what came before it. The history keeps them, off the active path. Returns them."""
        start = self.position(turn)
        if start is None:
            return []
        gone = self.turns[start:]
        del self.turns[start:]
        if self.saved is not None:
            self.saved.last_id = turn.parent_id
        return gone

    def delete_from(self, turn: Turn) -> list[Turn]:
        """Delete `turn` and the ones after it, from the history too. Returns them."""
        gone = self.rewind(turn)
        question_id = turn.question_id
        if gone and question_id is not None:
            self._save(lambda saved: saved.take_back(question_id, turn.parent_id))
        return gone

    def continue_reply(self, generate: Generate) -> Turn:
        """The last reply goes on where it stopped (max tokens, Esc, a full context): its tokens are given
        back to the engine, which finds them in its cache, and the continuation is a new branch."""
        turn = self.turns[-1]
        assert turn.reply is not None, "why_not_continue: only a reply goes on"
        self._start(turn, generate, list(turn.reply.tokens), continuing=True)
        return turn

    def why_not_reply(self, how: str) -> str | None:
        """Why the last reply cannot be written again ("regenerate") or gone on with ("continue") now."""
        if how == "continue":
            return self.why_not_continue()
        return None if self.turns and self.turns[-1].reply else "There is no reply to regenerate yet."

    def why_not_continue(self) -> str | None:
        if self.writing is not None:
            return "A reply is being written: Esc stops it first."
        reply = self.turns[-1].reply if self.turns else None
        if reply is None:
            return "There is no reply to continue yet."
        if reply.stop_reason in ("eos", "stop"):
            return f"It ended at its {STOP_LABELS[reply.stop_reason]}: regenerate it, or branch from a token."
        if reply.stop_reason == "context":
            return "The context is full: a bigger one (Ctrl+O) or a new chat."
        if not reply.tokens or any(token.token_id < 0 for token in reply.tokens):
            return ("This reply's tokens were not kept (it was reopened from the history, or a server sent no "
                    "token ids): regenerate it instead.")
        return None

    def stop(self) -> None:
        if self.writing is not None:
            self.writing.stream.cancel()

    def abandon(self) -> None:
        """The user moved on mid-reply (a new chat, another chat, quit): the engine is told to stop, and
        the reply ends at once as stopped, with what was written and the latest figures, in the turn and
        in the history (a record left "streaming" would reopen as interrupted)."""
        writing = self.writing
        if writing is None:
            return
        writing.stream.cancel()
        metrics = writing.metrics or TurnMetrics(completion_tokens=len(writing.tokens))
        done = Done("cancelled", writing.text, replace(metrics, completion_tokens=len(writing.tokens)),
                    reasoning=writing.reasoning, answer_from=writing.answer_from)
        self._finish(writing, done, keep_empty=True)

    def why_not_branch(self, turn: Turn) -> str | None:
        if self.writing is not None:
            return "A reply is being written: Esc stops it first."
        if not self.turns or turn is not self.turns[-1] or turn.reply is None:
            return "Only the latest reply can be branched."
        return None

    # --- the reply being written ----------------------------------------------------------------

    def _start(self, turn: Turn, generate: Generate, forced: list[Token] | None = None,
               continuing: bool = False) -> None:
        forced = forced or []
        if turn.branches:  # another branch of an answered turn: the settings it is written with are the chat's
            self.keep_settings()
        request = Request(self.messages(turn), self.live, top_logprobs=self.top_logprobs,
                          forced=tuple(token.token_id for token in forced),
                          forced_text=tuple(token.piece or token.text for token in forced), continuing=continuing,
                          conversation="" if self.conversation_id is None else str(self.conversation_id),
                          xray=self.xray, format=self.output_format, thinking=self.thinking)
        stream = self.tools.generate(generate, request) if self.tools is not None else generate(request)
        writer = None
        question_id = turn.question_id
        if self.saved is not None and question_id is not None:
            fork_of = turn.reply.message_id if forced and turn.reply else None
            writer = self._save(lambda saved: saved.start_reply(question_id, self.model, fork_of,
                                                                len(forced) - 1 if forced else None))
        self.writing = Writing(turn, stream, forced, writer, how="continued" if continuing else "branched",
                               started=request.submitted_at, model=self.model)

    def take(self, events: list[Event]) -> Update:
        """Apply a batch of the writing reply's events; returns what changed."""
        writing, update = self.writing, Update()
        assert writing is not None, "events come only for the reply being written"
        pending: list[str] = []
        thought: list[str] = []
        for event in events:
            if isinstance(event, Token):
                writing.tokens.append(writing.forced[len(writing.tokens)] if event.forced else event)
                pending.append(event.text)
                if event.thinking:
                    self._think(writing, event)
                    thought.append(event.reasoning)
                if not update.versions or update.versions[-1][0] != event.params_version:
                    update.versions.append((event.params_version, len(writing.tokens)))
            elif isinstance(event, PromptProgress):
                update.status = progress_line(event)
            elif isinstance(event, LoadProgress):  # the model loads again first (its engine process had died)
                update.status = event.stage
            elif isinstance(event, Metrics):
                update.metrics = writing.metrics = event.metrics
            elif isinstance(event, ToolActivity):
                self._tool_activity(writing, event, update)
            elif isinstance(event, (Done, Error)):
                self._append(writing, "".join(pending), "".join(thought), update)
                update.ending = self._finish(writing, event) if isinstance(event, Done) else self._fail(writing, event)
                return update
        self._append(writing, "".join(pending), "".join(thought), update)
        return update

    def _tool_activity(self, writing: Writing, event: ToolActivity, update: Update) -> None:
        """A call asked for, running or done: a new one, or the open one's new state, saved at once; the status
        says so."""
        calls = writing.tool_calls
        if event.stage != "asked" and calls and calls[-1].result is None and calls[-1].error is None:
            calls[-1] = event.call
        else:
            calls.append(event.call)
        if (writer := writing.writer) is not None:
            self._save(lambda _saved: writer.save_calls(tuple(calls)))
        update.tools = True
        name = event.call.name
        update.status = {"asked": f"Waiting for your consent to run {name}…", "running": f"Running {name}…",
                         "done": f"{name} done: the model goes on…"}[event.stage]

    @staticmethod
    def _think(writing: Writing, token: Token) -> None:
        """A token of the thinking: its count and time."""
        writing.answer_from += 1
        first = writing.thinking_span[0] if writing.thinking_span else token.at
        writing.thinking_span = (first, token.at)

    def _append(self, writing: Writing, text: str, thought: str, update: Update) -> None:
        """A batch's new answer text and thinking, kept and saved once."""
        if not text and not thought:
            return
        if not writing.visible:
            writing.visible = True
            update.status = ""
        writing.text += text
        writing.reasoning += thought
        update.text, update.reasoning = text, thought
        writer = writing.writer
        if writer is not None:
            self._save(lambda _saved: writer.append(text, thought))

    def _finish(self, writing: Writing, done: Done, keep_empty: bool = False) -> Ending:
        self.writing = None
        if done.stop_reason == "cancelled" and not written(done) and not done.tool_calls and not keep_empty:
            return replace(self._take_back(writing), done=done)
        footer = reply_footer(done.stop_reason, done.metrics.as_dict() | {"incomplete": done.incomplete,
                                                                           "stop_sequence": done.stop_sequence})
        notes = [note for note in (done.note, self._ended_at_once(writing, done)) if note]
        if writing.forced:
            read = done.metrics.prompt_tokens - done.metrics.cached_tokens
            footer += f" · {writing.how} at token {len(writing.forced)}, {read} token{'s' if read != 1 else ''} read"
        if done.metrics.dropped_turns:
            footer += f" · {left_out(done.metrics.dropped_turns)}"
            notes.append(f"{left_out(done.metrics.dropped_turns)} of the prompt to fit the "
                         f"{done.metrics.n_ctx:,}-token context (they stay in the chat).")
        waited = time.perf_counter() - writing.started
        if not self.streaming:
            footer += f" · {wait_note(done.metrics.ttft_s, waited)}"
        writer = writing.writer
        if writer is not None:
            self._save(lambda saved: saved.end_reply(writer, done))
        self._add_branch(writing, done.text, footer, done.stop_reason, done.prompt_ids, done.reasoning,
                         thinking_line(done.metrics.as_dict()), done.answer_from, done.metrics)
        return Ending("finished", " ".join(notes), done=done, waited_s=waited)

    @staticmethod
    def _ended_at_once(writing: Writing, done: Done) -> str:
        """A branch whose chosen token ended it before the model wrote one: why, since its footer shows 0 tokens."""
        if writing.how != "branched" or not writing.forced or done.metrics.completion_tokens:
            return ""
        chosen = quoted(writing.forced[-1].piece or writing.forced[-1].text)
        if done.stop_reason == "stop":
            sequence = f"the stop sequence {quoted(done.stop_sequence)}" if done.stop_sequence else "a stop sequence"
            return f"The token you chose, {chosen}, completes {sequence}: the reply ends there."
        if done.stop_reason == "eos":
            return f"The token you chose, {chosen}, ends the text: the reply ends there."
        return ""

    def _fail(self, writing: Writing, error: Error) -> Ending:
        """The engine gave up. What it wrote stays (a server's stream cut mid-reply, an engine process that died),
        marked as such."""
        self.writing = None
        error = replace(error, text=error.text or writing.text, reasoning=error.reasoning or writing.reasoning)
        reasoning = error.reasoning
        if not written(error) and not writing.tool_calls:
            self._take_back(writing)
            return Ending("restored" if writing.is_branch else "taken_back", error.message, died=error.died)
        writer = writing.writer
        if writer is not None:
            self._save(lambda saved: saved.end_reply(writer, error))
        said = error.died.said("") if error.died is not None else error.message
        self._add_branch(writing, error.text, f"cut short: {said}", reasoning=reasoning,
                         thought=thinking_line(writing.thinking_figures()), answer_from=writing.answer_from)
        return Ending("failed", error.message, died=error.died)

    def _add_branch(self, writing: Writing, text: str, footer: str, stop_reason: StopReason | None = None,
                    prompt_ids: tuple[int, ...] = (), reasoning: str = "", thought: str = "",
                    answer_from: int = 0, metrics: TurnMetrics | None = None) -> None:
        cut = len(writing.forced) - 1 if writing.forced else None
        turn = writing.turn
        turn.branches.append(Branch(
            text, footer, tokens=writing.tokens, cut=cut, message_id=writing.writer.id if writing.writer else None,
            stop_reason=stop_reason, prompt_ids=prompt_ids, model=writing.model, reasoning=reasoning, thought=thought,
            answer_from=answer_from, metrics=metrics, tool_calls=list(writing.tool_calls)))
        turn.active = len(turn.branches) - 1

    def _take_back(self, writing: Writing) -> Ending:
        """Nothing was written: a new branch gives way to the one before it; a new turn is removed."""
        turn = writing.turn
        writer, question_id = writing.writer, turn.question_id
        if writing.is_branch:
            if writer is not None:
                shown = turn.reply.message_id if turn.reply is not None else None
                self._save(lambda saved: saved.take_back(writer.id, shown))
            return Ending("restored")
        if question_id is not None:
            self._save(lambda saved: saved.take_back(question_id, turn.parent_id))
        self.turns.remove(turn)
        return Ending("taken_back")

    # --- the history ----------------------------------------------------------------------------

    def _save(self, write: Callable[[SavedChat], T]) -> T | None:
        """Write to the history; if it fails, say so once and go on unsaved (the chat itself is unharmed)."""
        if self.saved is None:
            return None
        try:
            return write(self.saved)
        except HistoryError as error:
            self.saved = None
            self.warn(f"{error}: the rest of this chat is not saved")
            return None

    def set_system_prompt(self, text: str) -> None:
        self.system_prompt = text
        if self.saved is not None and (conversation_id := self.saved.id) is not None:
            self._save(lambda saved: saved.history.update(conversation_id, system_prompt=text))

    def set_thinking(self, on: bool) -> None:
        """The chat's thinking switch, from the next reply on; saved with the chat."""
        self.thinking = on
        if self.saved is not None and (conversation_id := self.saved.id) is not None:
            self._save(lambda saved: saved.history.update(conversation_id, thinking=on))


def _settled_calls(message: StoredMessage) -> tuple[ToolCall, ...]:
    """A stored reply's calls; one the app stopped at (waiting for consent, or running) says so."""
    if message.state != "interrupted":
        return message.tool_calls
    why = {False: "never run: the app stopped while it waited for consent",
           True: "no result: the app stopped while it ran"}
    return tuple(call if call.result is not None or call.error is not None else replace(call, error=why[call.approved])
                 for call in message.tool_calls)


def turns_of(conversation: Conversation) -> list[Turn]:
    """A saved conversation's active path as turns; each reply carries its sibling branches."""
    turns: list[Turn] = []
    for message in conversation.path:
        if message.role == "user":
            turns.append(Turn(message.content, question_id=message.id, parent_id=message.parent_id))
            continue
        siblings = [m for m in conversation.siblings(message) if m.role == "assistant"]
        turns[-1].branches = [Branch(m.content, stored_footer(m, conversation.model), cut=m.fork_token,
                                     message_id=m.id, model=m.model, reasoning=m.reasoning,
                                     thought=thinking_line(m.metrics or {}),
                                     metrics=TurnMetrics.from_dict(m.metrics) if m.metrics else None,
                                     tool_calls=list(_settled_calls(m)))
                              for m in siblings]
        turns[-1].active = siblings.index(message)
    return turns


def opened(conversation: Conversation, live: LiveParams, saving: Saving | None, **options: Any) -> ChatSession:
    """A saved chat to go on with: its turns and branches, system prompt, model and output format."""
    session = ChatSession(live, saving=None, system_prompt=conversation.system_prompt, model=conversation.model,
                          output_format=conversation.output_format, **{**options, "thinking": conversation.thinking})
    if saving is not None:
        session.saved = SavedChat(saving, conversation.id, conversation.last_id,
                                  (conversation.sampling, conversation.output_format, conversation.tools))
    session.tool_switches = conversation.tools
    session.turns = turns_of(conversation)
    session.saved_title = conversation.title
    return session
