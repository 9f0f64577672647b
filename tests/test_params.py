import json
import math
import threading

import pytest

from tui_chat.engine.params import (
    DEFAULT_ORDER,
    LIST_PARAMS,
    LIST_SPECS,
    PARAMS,
    SPECS,
    InvalidParameter,
    LiveParams,
    SamplingParams,
    parse_logit_bias,
)


def test_defaults_come_from_the_table():
    params = SamplingParams()
    for spec in PARAMS:
        assert getattr(params, spec.name) == spec.default
        assert spec.minimum <= spec.default <= spec.maximum
        assert spec.hint


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("temperature", -1, "temperature must be between 0 and 2 (got -1)"),
        ("top_p", 2, "top_p must be between 0 and 1 (got 2)"),
        ("top_k", 2.5, "top_k must be a whole number (got 2.5)"),
        ("max_tokens", 0, "max_tokens must be between 1 and 131072 (got 0)"),
        ("temperature", "hot", "temperature must be a number (got 'hot')"),
        ("temperature", float("nan"), "temperature must be between 0 and 2 (got nan)"),
        ("seed", True, "seed must be a number (got True)"),
    ],
)
def test_invalid_values_are_refused_with_one_line(name, value, message):
    with pytest.raises(InvalidParameter) as caught:
        SamplingParams().with_changes(**{name: value})
    assert str(caught.value) == message


def test_unknown_parameter_and_bad_stops():
    with pytest.raises(InvalidParameter, match="unknown sampling parameter 'warmth'"):
        SamplingParams().with_changes(warmth=1)
    with pytest.raises(InvalidParameter, match="stop sequences must be non-empty text"):
        SamplingParams().with_changes(stop=["ok", ""])


def test_values_are_coerced_to_their_kind():
    params = SamplingParams().with_changes(top_k="40", temperature=1, stop="END")
    assert params.top_k == 40 and isinstance(params.top_k, int)
    assert params.temperature == 1.0 and isinstance(params.temperature, float)
    assert params.stop == ("END",)


def test_live_params_bump_version_only_on_valid_change():
    live = LiveParams()
    version, _ = live.snapshot()
    live.update(temperature=0.3)
    assert live.snapshot() == (version + 1, SamplingParams(temperature=0.3))
    with pytest.raises(InvalidParameter):
        live.update(temperature=9)
    assert live.version == version + 1


def test_live_params_survive_concurrent_writers():
    live = LiveParams()
    threads = [threading.Thread(target=lambda: [live.update(top_k=k) for k in range(200)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert live.version == 800
    assert SPECS["top_k"].minimum <= live.snapshot()[1].top_k < 200


def test_new_samplers_are_off_by_default_as_in_llama_cpp():
    from tui_chat.engine.local.chain import is_on

    params = SamplingParams()
    for stage in ("dry", "top_n_sigma", "typical_p", "xtc", "mirostat_v2", "logit_bias"):
        assert not is_on(stage, params), stage
    assert params.sampler_order == DEFAULT_ORDER


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("top_k, min_p,temperature", ("top_k", "min_p", "temperature")),
        (["typ_p", "temp"], ("typical_p", "temperature")),  # llama.cpp's own names
    ],
)
def test_sampler_order_is_read_from_text_or_a_list(value, expected):
    assert SamplingParams().with_changes(sampler_order=value).sampler_order == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("top_k,warmth", "sampler_order takes names from penalties, dry, .* \\(got 'warmth'\\)"),
        ("top_k,top_k", "sampler_order names a sampler twice"),
        ("", "sampler_order takes names"),
        (3, "sampler_order must be a list of sampler names"),
    ],
)
def test_bad_sampler_orders_are_refused(value, message):
    with pytest.raises(InvalidParameter, match=message):
        SamplingParams().with_changes(sampler_order=value)


def test_logit_bias_entries():
    assert parse_logit_bias("Paris=-inf") == ("Paris", -math.inf)
    assert parse_logit_bias("a=b=1.5") == ("a=b", 1.5)
    params = SamplingParams().with_changes(logit_bias=[" Paris=-inf", ("the", 2), "the=3"])
    assert params.logit_bias == ((" Paris", -math.inf), ("the", 3.0))
    assert SamplingParams().with_changes(logit_bias={"x": -5}).logit_bias == (("x", -5.0),)
    # a stored conversation comes back through JSON as lists
    stored = json.loads(json.dumps(params.as_dict()))
    assert SamplingParams().with_changes(**stored) == params


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["Paris"], "logit bias must be TEXT=BIAS"),
        (["=5"], "a logit bias needs a non-empty text"),
        (["x=inf"], "the logit bias of 'x' must be between -100 and 100, or -inf to ban it"),
        (["x=lots"], "the logit bias of 'x' must be between"),
        ([("x", True)], "the logit bias of 'x' must be between"),
        ("x=1", "logit_bias must be a list of TEXT=BIAS entries"),
    ],
)
def test_bad_logit_bias_is_refused(value, message):
    with pytest.raises(InvalidParameter, match=message):
        SamplingParams().with_changes(logit_bias=value)


def test_list_settings_parse_one_command_line_value_each():
    assert LIST_SPECS["logit_bias"].parse("Paris=-2") == ("Paris", -2.0) and LIST_SPECS["logit_bias"].repeatable
    assert LIST_SPECS["sampler_order"].parse("top_k,temp") == ("top_k", "temperature")
    assert [spec.control for spec in LIST_PARAMS] == ["stops", "bias", "order"]


def test_live_params_remember_the_settings_of_recent_versions():
    live = LiveParams()
    live.update(top_k=5)
    live.update(top_k=6)
    assert live.at(1).top_k == 5 and live.at(2).top_k == 6 and live.at(0) == SamplingParams()
    for k in range(LiveParams.KEPT_VERSIONS):
        live.update(top_k=k)
    with pytest.raises(KeyError):
        live.at(1)
