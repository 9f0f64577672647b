"""A reply that may call tools: the model writes, a call it makes is run (with the user's consent) and its result
fed back, and the model goes on, until it answers or has made `call_limit` calls.

`ToolUse` wraps a backend's `generate`: the session hands it each request and reads one stream back, as
from any backend. The steps run on a thread of their own. A step that ends in a call gives the stream
`ToolActivity` events (asked, running, done) instead of its tokens: they, and the text and thinking before the
call, travel in the `ToolCall` (its block shows them; the heatmap and the inspector read them). The step that
answers gives its events as a backend would, and its `Done` carries every call made before it
(`Done.tool_calls`). While tools can be called (`auto`), a step's tokens are held until it ends, since only its
end says whether it was a call.

Time: each step's clock starts when it is asked for, so no step counts the wait for consent or a tool's run as
model time. The reply's TTFT is its first step's (the model's first token, a call's or the answer's), its decode
rate the answering step's; the wait for the user's yes is `consent_s`, apart.

Consent: before a call runs, `consent(call)` is asked on that thread and its Future awaited (a dialog answers
it later; the headless runner at once); Esc (the stream's cancel) stops the wait. "always" lets that tool run
in this chat without asking again.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from ..engine.base import Done, Error, Event, Message, Request, Stream, Token, ToolActivity, ToolCall, TurnMetrics
from ..safetext import terminal_safe
from .calls import (
    AUTO,
    GENERIC,
    NONE,
    Call,
    CallForm,
    call_format,
    cut_call,
    step_calls,
    step_messages,
    template_tools,
    with_instructions,
)
from .mcp import CallCancelled, Tool, ToolError, ToolServers

Decision = Literal["once", "always", "deny"]
Consent = Callable[[ToolCall], "concurrent.futures.Future[Decision]"]
Generate = Callable[[Request], Stream]
CONSENT_POLL_S = 0.1
MIN_RESULT_CHARS = 1_000
MAX_LINE_ARGUMENTS = 200


def decided(decision: Decision) -> concurrent.futures.Future[Decision]:
    """A consent answered already (the headless runner's)."""
    future: concurrent.futures.Future[Decision] = concurrent.futures.Future()
    future.set_result(decision)
    return future


def approve_listed(names: Sequence[str]) -> Consent:
    """`run --approve all|NAME,…`: the listed tools run, any other call is not approved (nobody is asked)."""
    allowed = set(names)
    return lambda call: decided("once" if "all" in allowed or call.name in allowed else "deny")


@dataclass(eq=False)
class ToolUse:
    """A chat's tools: those on, how the model may call them (`choice`: auto, none, required or a tool's name),
    who consents, and the limits. `result_chars`: how much of one result the model reads (the rest is cut,
    and the cut said), from the context's size."""

    servers: ToolServers
    tools: list[Tool]
    consent: Consent
    choice: str = AUTO
    call_limit: int = 8
    call_timeout_s: float = 60.0
    result_chars: int = 4096
    always: set[str] = field(default_factory=set)  # tools the user let run in this chat without asking
    form: CallForm = GENERIC  # how the model writes calls and reads results (its template's form, or generic)

    def generate(self, generate: Generate, request: Request) -> Stream:
        """The reply to `request`, written with `generate` (the backend's), calling tools as it goes."""
        if self.choice == NONE or not self.tools:
            return generate(request)
        stream = Stream()
        threading.Thread(target=self._reply, args=(generate, request, stream), name="tool-reply",
                         daemon=True).start()
        return stream

    def replay(self, calls: Sequence[ToolCall]) -> list[Message]:
        """An earlier reply's calls as a later prompt holds them: in this model's form, with the text and thinking
        written before each, each result as the model read it."""
        return [message for number, call in enumerate(calls, start=1)
                for message in step_messages([(call, self._seen(call))], self.form, number)]

    # --- the reply's thread ------------------------------------------------------------------------

    def _reply(self, generate: Generate, request: Request, out: Stream) -> None:
        try:
            self._steps(generate, request, out)
        except Exception as error:  # noqa: BLE001 - the thread boundary: the reply ends with one line
            out.put(Error(f"tool call failed: {type(error).__name__}: {error}"))

    def _steps(self, generate: Generate, request: Request, out: Stream) -> None:
        calls: list[ToolCall] = []
        form = self.form
        messages = request.messages if form.templated else with_instructions(request.messages, self.tools)
        tools = template_tools(self.tools) if form.templated else ()
        choice = self.choice
        step = replace(request, messages=messages, tools=tools, format=call_format(self.tools, choice, form),
                       tool_choice=choice)
        made = added = 0  # tokens the model drew writing its calls; prompt tokens their results added
        before: TurnMetrics | None = None  # the figures of the step that made the latest call
        first: float | None = None  # the reply's TTFT: its first step's
        waited = [0.0]  # seconds spent waiting for consent
        while True:
            held, final = self._written(generate(step), out, hold=choice != NONE)
            if isinstance(final, Error) and final.tools_refused and not calls:
                self._refused(generate, request, final.message, out)
                return
            done = final if isinstance(final, Done) else None
            if done is not None and before is None:
                first = done.metrics.ttft_s
            if done is not None and before is not None:
                added += max(done.metrics.prompt_tokens - before.prompt_tokens - before.completion_tokens, 0)
            found = step_calls(done, self.tools, form) if done is not None and choice != NONE else []
            cut = cut_call(done, self.tools, choice, form) if done is not None and not found else None
            if cut is not None and done is not None:  # the call goes in the record, not the answer's text
                calls.append(self._said(out, ToolCall(
                    cut.tool.server, cut.tool.name, {}, error=cut.problem, before=cut.before, reasoning=done.reasoning,
                    tokens=tuple(event for event in held if isinstance(event, Token)))))
                held = [event for event in held if not isinstance(event, Token)]  # its tokens: the reply's own count
                done = replace(done, text="", reasoning="", incomplete=False, answer_from=0)
            if not found or done is None or out.cancelled.is_set():
                for event in held:
                    out.put(event)
                out.put(final if done is None else replace(
                    done, tool_calls=(*calls, *done.tool_calls),
                    metrics=replace(done.metrics, tool_call_tokens=made, tool_result_tokens=added,
                                    ttft_s=first, consent_s=waited[0])))
                return
            before = done.metrics
            made += before.completion_tokens
            if all(any(old.name == call.tool.name and old.arguments == call.arguments for old in calls)
                   for call in found):
                choice = NONE  # the same calls again would bring the same results: the model answers instead
            else:
                tokens = tuple(event for event in held if isinstance(event, Token))
                written = [ToolCall(call.tool.server, call.tool.name, call.arguments, before=call.before,
                                    reasoning=done.reasoning, tokens=tokens) if index == 0 else
                           ToolCall(call.tool.server, call.tool.name, call.arguments)
                           for index, call in enumerate(found)]  # a step's text and tokens go with its first call
                ran = [self._run(call, record, out, waited) if len(calls) + index < self.call_limit
                       else self._over(record, out)
                       for index, (call, record) in enumerate(zip(found, written, strict=True))]
                messages = [*messages, *step_messages([(record, self._seen(record)) for record in ran], form,
                                                      len(calls) + 1, [call.ident for call in found])]
                calls += ran
                if out.cancelled.is_set():  # stopped during consent or a call: the reply ends with its calls
                    out.put(replace(done, stop_reason="cancelled", text="", reasoning="", incomplete=False,
                                    answer_from=0, tool_calls=tuple(calls), metrics=replace(
                                        before, completion_tokens=0, tool_call_tokens=made, tool_result_tokens=added,
                                        ttft_s=first, consent_s=waited[0])))
                    return
                choice = AUTO if len(calls) < self.call_limit else NONE
            step = replace(request, messages=messages, tools=tools, format=call_format(self.tools, choice, form),
                           tool_choice=choice, forced=(), forced_text=(), continuing=False,
                           submitted_at=time.perf_counter())

    @staticmethod
    def _written(stream: Stream, out: Stream, *, hold: bool) -> tuple[list[Event], Done | Error]:
        """One step's events: the tokens held (`hold`) or passed on, the rest passed on; its final event.
        A cancel of the reply reaches the step."""
        held: list[Event] = []
        final: Done | Error | None = None
        while final is None:
            if out.cancelled.is_set():
                stream.cancel()
            for event in stream.drain(timeout=CONSENT_POLL_S):
                if isinstance(event, (Done, Error)):
                    final = event
                elif hold and isinstance(event, Token):
                    held.append(event)
                else:
                    out.put(event)
        return held, final

    def _run(self, call: Call, record: ToolCall, out: Stream, waited: list[float]) -> ToolCall:
        """Ask, then run the call (`record`: as the model wrote it); what came of it (never raises). The time
        spent asking is added to `waited`."""
        if call.problem:
            return self._said(out, replace(record, error=call.problem))
        out.put(ToolActivity(record, "asked"))
        asked = time.perf_counter()
        decision = "once" if call.tool.name in self.always else self._ask(record, out)
        waited[0] += time.perf_counter() - asked
        if decision == "deny":
            return self._said(out, replace(record, error="not run: the reply was stopped while it waited for "
                                           "consent" if out.cancelled.is_set() else
                                           "not approved: the user did not allow this call"))
        if decision == "always":
            self.always.add(call.tool.name)
        record = replace(record, approved=True)
        out.put(ToolActivity(record, "running"))
        started = time.perf_counter()
        try:
            outcome = self.servers.call(call.tool, call.arguments, self.call_timeout_s, out.cancelled)
        except CallCancelled:
            return self._said(out, replace(record, error="cancelled: the reply was stopped while it ran",
                                           ms=round((time.perf_counter() - started) * 1000, 1)))
        except ToolError as error:
            return self._said(out, replace(record, error=str(error)))
        text = terminal_safe(outcome.text)
        cut = max(len(text) - self.result_chars, 0)
        ms = round(outcome.ms, 1)
        if outcome.is_error:
            return self._said(out, replace(record, error=text[: self.result_chars] or "the tool failed", ms=ms,
                                           cut=cut))
        return self._said(out, replace(record, result=text, ms=ms, cut=cut))

    def _over(self, record: ToolCall, out: Stream) -> ToolCall:
        """A call past the reply's limit, in a step that made several (a server's): not run, and said so."""
        return self._said(out, replace(record, error=f"not run: the reply may make {self.call_limit} calls"))

    def _refused(self, generate: Generate, request: Request, line: str, out: Stream) -> None:
        """A server that cannot take tools: the chat's tools are off from now on, the reply is written without
        them, and its end says so in one line."""
        self.tools = []
        final = self._written(generate(request), out, hold=False)[1]
        out.put(replace(final, note=line) if isinstance(final, Done) else final)

    def _ask(self, record: ToolCall, out: Stream) -> Decision:
        """The user's answer; "deny" when the reply is stopped while waiting, or the consent fails."""
        pending = self.consent(record)
        while not out.cancelled.is_set():
            try:
                return pending.result(timeout=CONSENT_POLL_S)
            except concurrent.futures.TimeoutError:
                continue
            except Exception:  # noqa: BLE001 - a consent that broke is a no
                return "deny"
        pending.cancel()
        return "deny"

    @staticmethod
    def _said(out: Stream, record: ToolCall) -> ToolCall:
        out.put(ToolActivity(record, "done"))
        return record

    def _seen(self, record: ToolCall) -> str:
        """The result (or the error) as the model reads it: at most `result_chars`, the cut said."""
        if record.result is None:
            return f"error: {record.error}"
        if not record.cut:
            return record.result
        return (f"{record.result[: self.result_chars]}\n[cut {record.cut:,} characters of {len(record.result):,}: "
                "the result was longer than the context can take]")


def result_budget(n_ctx: int) -> int:
    """Characters of one result the model reads: about a quarter of the context (4 characters a token)."""
    return max(MIN_RESULT_CHARS, n_ctx)


def call_line(call: ToolCall) -> str:
    """One call in one line: `get_current_time {"timezone": "Asia/Tokyo"} → 140 characters in 3 ms`."""
    arguments = json.dumps(call.arguments, ensure_ascii=False)
    head = f"{call.server}/{call.name} {terminal_safe(arguments[:MAX_LINE_ARGUMENTS])}"
    if not call.approved:
        return f"{head} → {call.error} (not run)"
    if call.result is None:
        return f"{head} → error: {terminal_safe(' '.join((call.error or '').split())[:MAX_LINE_ARGUMENTS])}"
    cut = f", {call.cut:,} cut for the model" if call.cut else ""
    return f"{head} → {len(call.result):,} characters in {call.ms or 0:,.0f} ms{cut}"
