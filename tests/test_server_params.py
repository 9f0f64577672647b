"""Which sampling settings each server family gets, under which field: the data the remote backend sends,
checked against a real llama_cpp.server on loopback where one can answer."""

import json
import math

import httpx

from tui_chat.engine.params import SamplingParams
from tui_chat.engine.server_params import SERVER_FIELDS, ignored_settings, server_fields

FANCY = SamplingParams().with_changes(
    logit_bias=[" Paris=-inf", "the=2"], mirostat_tau=5, dry_multiplier=0.8, typical_p=0.9,
    sampler_order="top_k,typ_p,temperature",
)


def test_llama_server_takes_every_setting_in_its_own_names():
    body, refused = server_fields("llama.cpp server", FANCY)
    assert refused == ()
    assert body["mirostat"] == 2 and body["mirostat_tau"] == 5.0
    assert body["logit_bias"] == [[" Paris", False], ["the", 2.0]]  # JSON has no -inf: false bans
    assert body["samplers"] == ["top_k", "typ_p", "temperature"]
    assert body["dry_multiplier"] == 0.8 and body["typical_p"] == 0.9
    json.dumps(body, allow_nan=False)


def test_settings_that_are_off_are_still_sent_where_the_server_defaults_differ():
    body, refused = server_fields("llama.cpp server", SamplingParams(top_k=0))
    assert body["top_k"] == 0 and body["mirostat"] == 0 and "mirostat_tau" not in body
    assert refused == ()


def test_a_server_that_lacks_a_sampler_in_use_refuses_it_by_name():
    _, refused = server_fields("vLLM", FANCY)
    assert set(refused) == {"typical_p", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
                            "mirostat_tau", "mirostat_eta", "logit_bias", "sampler_order"}
    body, refused = server_fields("vLLM", SamplingParams())
    assert refused == () and body["repetition_penalty"] == 1.1
    assert "typical_p" in ignored_settings("OpenAI-compatible server")
    assert set(SERVER_FIELDS["OpenAI-compatible server"]) == {"frequency_penalty", "presence_penalty"}


def test_llama_cpp_python_server_accepts_its_fields(tiny_server):
    body, refused = server_fields("llama-cpp-python server", FANCY.with_changes(dry_multiplier=0.0, typical_p=1.0,
                                                                                sampler_order=SamplingParams().sampler_order))
    assert refused == ()
    assert body["mirostat_mode"] == 2 and body["logit_bias_type"] == "tokens"
    assert body["logit_bias"][" Paris"] == -math.inf
    request = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4} | body
    answer = httpx.post(f"{tiny_server}/chat/completions", content=json.dumps(request),  # -Infinity: Python reads it
                        headers={"Content-Type": "application/json"}, timeout=60)
    assert answer.status_code == 200, answer.text
