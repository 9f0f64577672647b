import threading

import pytest

from tui_chat.engine.params import PARAMS, SPECS, InvalidParameter, LiveParams, SamplingParams


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
