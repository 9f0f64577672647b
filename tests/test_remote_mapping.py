"""What each kind of server is sent and what it reports back, end to end through the remote backend.

Token ids and branches, the prompt's figures while a reply streams and when it is stopped, the model's
name and quantisation, a base model behind a server (issue 16); every sampling setting and output format
in the server's own fields, or refused in one line (issues 19, 20). Against the fake in fake_openai.py
(llama-server's, vLLM's and a plain server's wire format) and a real llama_cpp.server on loopback.
"""

import json
import math

import jsonschema
import pytest

from conftest import GREEDY
from fake_openai import ALTERNATIVE, REPLY, fake_server, prompt_words, token_id
from test_formats import SCHEMA
from test_remote import PROMPT, connect
from tui_chat.engine.base import Done, Error, Message, Metrics, PromptProgress, Request, Stream, Token
from tui_chat.engine.formats import choose, grammar, json_schema
from tui_chat.engine.openai import OpenAIBackend, RemoteSettings
from tui_chat.engine.openai.streamed import stop_reason
from tui_chat.engine.params import LiveParams, SamplingParams
from tui_chat.engine.templates import NAMED_TEMPLATES, PLAIN
from tui_chat.session import ChatSession, Ending
from tui_chat.ui.screens.inspector import candidate_lines

QUESTION = "What is the capital of France?"
WAIT_S = 60


def events_of(stream: Stream) -> list:
    """Every event of a reply, with a bound on the wait: a reply that never ends fails here, not by hanging."""
    events = []
    while not stream.finished:
        batch = stream.drain(timeout=WAIT_S)
        assert batch, "the reply stopped sending events"
        events += batch
    return events


def answer(backend, messages: list[Message] | str, params: SamplingParams = GREEDY,
           **request) -> tuple[list, Done | Error]:
    if isinstance(messages, str):
        messages = [Message("user", messages)]
    events = events_of(backend.generate(Request(messages, LiveParams(params), **request)))
    return events, events[-1]


def answered(base_url: str, model: str | None, *args, **request) -> tuple[OpenAIBackend, list, Done | Error]:
    """One reply from a backend of its own on `base_url` (closed after): the backend, the events, the last one."""
    backend = connect(base_url, model)
    try:
        events, final = answer(backend, *args, **request)
    finally:
        backend.close()
    return backend, events, final


def tokens_of(events: list) -> list[Token]:
    return [event for event in events if isinstance(event, Token)]


def finish(session: ChatSession) -> Ending:
    return session.take(events_of(session.writing.stream)).ending


@pytest.fixture(scope="module")
def tiny_remote(tiny_server):
    backend = connect(tiny_server, "tiny")
    yield backend
    backend.close()


# --- token ids and branches --------------------------------------------------------------------


def test_llama_server_token_ids_mark_the_drawn_token_and_a_branch_goes_on_from_the_chosen_one(fake):
    backend = connect(fake.base_url, "words")
    try:
        session = ChatSession(LiveParams(GREEDY), top_logprobs=2)
        session.ask(QUESTION, backend.generate)
        assert finish(session).kind == "finished"
        drawn = session.turns[-1].reply.tokens[2]
        assert drawn.piece == " the" and drawn.token_id == token_id(" the") == drawn.top[0].token_id
        assert drawn.is_candidate(drawn.top[0]) and not drawn.is_candidate(drawn.top[1])
        session.branch(2, drawn.top[1], backend.generate)
        ending = finish(session)
    finally:
        backend.close()
    assert fake.requests[-1]["messages"][-1] == {"role": "assistant", "content": f"Paris is{ALTERNATIVE}"}
    branch = session.turns[-1].reply
    assert ending.kind == "finished" and branch.text == f"Paris is{ALTERNATIVE} " + " ".join(REPLY.split()[3:])
    assert [t.token_id for t in branch.tokens[:3]] == [token_id("Paris"), token_id(" is"), token_id(ALTERNATIVE)]
    assert branch.footer.endswith("branched at token 3, 1 token read")  # the server's cache held the rest
    assert len(session.turns[-1].branches) == 2


def test_a_server_without_ids_marks_the_drawn_token_by_text_and_says_why_it_cannot_branch(tiny_remote):
    session = ChatSession(LiveParams(GREEDY.with_changes(max_tokens=8)), top_logprobs=3)
    session.ask(PROMPT, tiny_remote.generate)
    finish(session)
    tokens = session.turns[-1].reply.tokens
    assert all(token.token_id == -1 for token in tokens)
    for token in tokens:
        assert sum(token.is_candidate(candidate) for candidate in token.top) == 1
        assert sum("▶" in line.plain for line in candidate_lines(token, GREEDY)) == 1
    other = next(c for c in tokens[0].top if not tokens[0].is_candidate(c))
    session.branch(0, other, tiny_remote.generate)
    ending = finish(session)
    assert ending.kind == "restored" and "cannot continue a reply from a chosen token" in ending.message
    assert len(session.turns[-1].branches) == 1 and session.writing is None


def test_vllm_continues_a_branch_and_a_plain_server_refuses_one():
    with fake_server(family="vllm") as server:
        _, events, done = answered(server.base_url, "words", QUESTION, forced=(-1, -1), forced_text=("Paris", " was"))
        sent = server.requests[-1]
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert [t.text for t in tokens_of(events) if t.forced] == ["Paris", " was"]
    assert done.text.startswith("Paris was the capital")
    with fake_server(family="openai") as server:
        _, _, refused = answered(server.base_url, "words", QUESTION, forced=(-1,), forced_text=("Paris",))
        assert server.requests == []
    assert isinstance(refused, Error) and "cannot continue a reply from a chosen token" in refused.message


# --- the prompt's figures while a reply streams, and when it is stopped ---------------------------


def stopped_after(backend, messages: list[Message], tokens: int) -> list:
    """A slow reply stopped (Esc) after `tokens` tokens: its events, the final Done last."""
    stream = backend.generate(Request(messages, LiveParams(GREEDY.with_changes(max_tokens=1000))))
    events = []
    while len(tokens_of(events)) < tokens:
        events += stream.drain(timeout=WAIT_S)
    stream.cancel()
    return events + events_of(stream)


def test_a_reply_stopped_early_keeps_what_llama_server_read_and_reused(fake):
    backend = connect(fake.base_url, "slow")
    question = [Message("user", QUESTION)]
    try:
        first = stopped_after(backend, question, 1)
        again = stopped_after(backend, question, 1)
    finally:
        backend.close()
    prompt = len(prompt_words([{"role": "user", "content": QUESTION}]))
    progress = [event for event in first if isinstance(event, PromptProgress)]
    assert (progress[0].done, progress[-1].done, progress[-1].total) == (0, prompt, prompt)
    before_any_token = [e.metrics for e in first[: first.index(tokens_of(first)[0])] if isinstance(e, Metrics)]
    assert before_any_token[-1].prompt_tokens == prompt and not before_any_token[-1].prompt_estimated
    done = first[-1]
    assert done.stop_reason == "cancelled" and done.text.startswith(" word0")
    assert (done.metrics.prompt_tokens, done.metrics.cached_tokens, done.metrics.prefill_s) == (prompt, 0, 0.0125)
    assert again[-1].metrics.cached_tokens == prompt, "the same question again: the server's cache held it all"
    assert fake.requests[-1]["return_progress"] is True and fake.requests[-1]["timings_per_token"] is True


def test_a_server_that_reports_nothing_early_gets_an_estimate_the_usage_corrects():
    with fake_server(family="openai") as server:
        backend = connect(server.base_url, "slow")
        try:
            stopped = stopped_after(backend, [Message("user", QUESTION)], 2)
            backend.settings = RemoteSettings(server.base_url, "words")
            _, done = answer(backend, QUESTION)
        finally:
            backend.close()
    estimate = math.ceil(len(QUESTION) / 4)
    first = next(event.metrics for event in stopped if isinstance(event, Metrics))
    assert (first.prompt_tokens, first.prompt_estimated) == (estimate, True)
    assert (stopped[-1].metrics.prompt_tokens, stopped[-1].metrics.prompt_estimated) == (estimate, True)
    assert done.metrics.prompt_tokens == len(prompt_words([{"role": "user", "content": QUESTION}]))
    assert not done.metrics.prompt_estimated


def test_vllm_reports_usage_with_every_chunk_and_gets_its_top_k_spelling():
    with fake_server(family="vllm") as server:
        backend, events, done = answered(server.base_url, "words", QUESTION, GREEDY.with_changes(top_k=0))
        sent = server.requests[-1]
    assert backend.info.description.startswith("vLLM") and backend.info.n_ctx == 8192
    assert sent["top_k"] == -1 and sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    after_first_token = [e.metrics for e in events[events.index(tokens_of(events)[0]):] if isinstance(e, Metrics)]
    assert after_first_token and not any(metrics.prompt_estimated for metrics in after_first_token)
    assert done.metrics.prompt_tokens == len(prompt_words([{"role": "user", "content": QUESTION}]))


def test_counting_tokens_mid_reply_does_not_cut_a_llama_cpp_python_stream(tiny_remote):
    """llama_cpp.server ends a stream when any other request arrives (its interrupt_requests): the draft's
    count must not ask it while a reply streams."""
    stream = tiny_remote.generate(Request([Message("user", PROMPT)], LiveParams(GREEDY.with_changes(max_tokens=120))))
    events = []
    while not tokens_of(events):
        events += stream.drain(timeout=WAIT_S)
    assert tiny_remote.count_tokens("Hello world, again") == math.ceil(len("Hello world, again") / 4)
    done = events_of(stream)[-1]
    assert isinstance(done, Done) and done.stop_reason == "length" and done.metrics.completion_tokens == 120
    assert tiny_remote.count_tokens("Hello world") == 2, "between replies the server counts"


def test_a_stream_ended_without_a_finish_reason_is_an_interruption_not_an_end_of_text(fake):
    _, _, final = answered(fake.base_url, "interrupted", "hi")
    assert isinstance(final, Error) and final.text == "Paris"
    assert "ended the reply without saying why" in final.message


# --- the model's name and quantisation; a base model behind a server ----------------------------


def test_a_model_named_by_its_path_shows_its_file_name_and_quantisation():
    path = "/srv/models/words.gguf"
    with fake_server(served=(path,)) as server:
        backend, _, done = answered(server.base_url, None, "hi")
        assert server.requests[-1]["model"] == path
    assert (backend.info.name, backend.info.quantization, backend.info.chat_format) == ("words", "Q4_K_M", "server")
    assert done.text == REPLY


def test_a_base_model_behind_llama_server_ends_its_turn_at_the_transcripts_user_line():
    with fake_server(chat_template=NAMED_TEMPLATES[PLAIN] + "\n") as server:
        backend, _, done = answered(server.base_url, "words", "hi")
        sent = server.requests[-1]
    assert backend.info.chat_format == PLAIN and sent["stop"] == ["\nUser:"]
    assert done.stop_reason == "stop", "as the in-process engine names the plain transcript's end"
    assert stop_reason("stop", GREEDY) == "eos" and stop_reason("stop", GREEDY, ("\nUser:",)) == "stop"


# --- sampling settings and output formats, in each server's own fields ---------------------------

FANCY = GREEDY.with_changes(logit_bias=[" Paris=-inf"], mirostat_tau=5, dry_multiplier=0.8, xtc_probability=0.5,
                            sampler_order="top_k,typ_p,temperature")


def test_every_setting_reaches_llama_server_in_its_own_names_and_the_rest_are_named(fake):
    backend, _, _ = answered(fake.base_url, "words", "hi", FANCY)
    sent = fake.requests[-1]
    sent_params = (sent["mirostat"], sent["mirostat_tau"], sent["dry_multiplier"], sent["xtc_probability"])
    assert sent_params == (2, 5.0, 0.8, 0.5)
    assert sent["samplers"] == ["top_k", "typ_p", "temperature"] and sent["logit_bias"] == [[" Paris", False]]
    assert backend.info.ignored_params == () and backend.info.ignored_formats == ()
    assert backend.info.notes == ("logit bias: the bias goes to every token of the text as the server tokenizes it, "
                                  "not only the first",)
    with fake_server(family="vllm") as server:
        vllm, _, _ = answered(server.base_url, "words", "hi", FANCY)
        sent = server.requests[-1]
    assert {"dry_multiplier", "mirostat_tau", "logit_bias", "sampler_order"} <= set(vllm.info.ignored_params)
    assert not {"dry_multiplier", "mirostat", "logit_bias", "samplers", "xtc_probability"} & set(sent)


def test_a_ban_reaches_llama_cpp_python_as_minus_infinity(tiny_remote):
    events, free = answer(tiny_remote, PROMPT, top_logprobs=1)
    first = tokens_of(events)[0].piece
    _, banned = answer(tiny_remote, PROMPT, GREEDY.with_changes(logit_bias=[(first, -math.inf)]))
    assert isinstance(banned, Done) and not banned.text.startswith(first), (first, free.text, banned.text)


def test_formats_go_to_llama_server_in_its_fields_and_a_server_that_cannot_refuses_in_one_line(fake):
    backend = connect(fake.base_url, "words")
    try:
        answer(backend, "hi", format=json_schema(json.dumps(SCHEMA)))
        schema_sent = fake.requests[-1]["response_format"]
        answer(backend, "hi", format=grammar('root ::= "yes" | "no"'))
        grammar_sent = fake.requests[-1]["grammar"]
    finally:
        backend.close()
    assert schema_sent == {"type": "json_schema", "json_schema": {"schema": SCHEMA}}
    assert grammar_sent == 'root ::= "yes" | "no"'
    with fake_server(family="vllm") as server:
        vllm, _, refused = answered(server.base_url, "words", "hi", format=grammar('root ::= "yes"'))
        assert server.requests == []
    assert vllm.info.ignored_formats == ("grammar",) and vllm.info.notes == ()  # its JSON mode is ours: an object
    assert vllm.info.server_facts[1:] == ("No grammar output",)
    assert isinstance(refused, Error) and refused.text == "" and "\n" not in refused.message
    assert refused.message.startswith("the vLLM at 127.0.0.1:")
    assert "cannot be asked for grammar output" in refused.message


def test_formats_through_the_backend_against_llama_cpp_server(tiny_remote):
    params = GREEDY.with_changes(max_tokens=300)
    for output, check in (
        (json_schema(json.dumps(SCHEMA)), lambda text: jsonschema.validate(json.loads(text), SCHEMA)),
        (grammar('root ::= "yes" | "no"'), lambda text: text in ("yes", "no") or pytest.fail(text)),
    ):
        _, done = answer(tiny_remote, "Hi", params, format=output)
        assert isinstance(done, Done) and done.stop_reason == "eos" and not done.incomplete, done
        check(done.text)
    # JSON mode is an object there too (the server's own json_object); the random tiny model may loop inside a
    # key of it until max tokens, which the server does not bound as the local engine does
    _, done = answer(tiny_remote, "Hi", params, format=choose("json"))
    assert isinstance(done, Done) and done.text.lstrip().startswith("{"), done
    assert isinstance(json.loads(done.text), dict) if done.stop_reason == "eos" else done.incomplete
    _, cut = answer(tiny_remote, "Hi", GREEDY.with_changes(max_tokens=2), format=json_schema(json.dumps(SCHEMA)))
    assert cut.stop_reason == "length" and cut.incomplete


def test_a_reply_cut_at_max_tokens_goes_on_on_llama_server(fake):
    """F8 on a server's reply: its tokens (ids from llama-server) are the start the server continues, and max
    tokens counts after them, as in the in-process engine."""
    backend = connect(fake.base_url, "words")
    try:
        session = ChatSession(LiveParams(GREEDY.with_changes(max_tokens=3)), top_logprobs=2)
        session.ask(QUESTION, backend.generate)
        finish(session)
        assert session.why_not_continue() is None
        session.continue_reply(backend.generate)
        ending = finish(session)
    finally:
        backend.close()
    sent = fake.requests[-1]
    assert sent["messages"][-1] == {"role": "assistant", "content": "Paris is the"} and sent["max_tokens"] == 3
    assert ending.kind == "finished" and session.turns[-1].reply.text == "Paris is the capital of France"
    assert session.turns[-1].reply.footer.startswith("max tokens · 3 tokens")
