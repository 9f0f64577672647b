"""Money arithmetic, price presets, config overrides and `tui-chat estimate`."""

import json
from decimal import Decimal

import pytest

from conftest import run_cli
from tui_chat.config import ConfigError, load_config
from tui_chat.pricing import (
    PRESETS,
    Estimate,
    PricingError,
    find_preset,
    format_usd,
    presets_with,
    turn_cost,
    words_to_tokens,
)

GPT_4O = PRESETS["GPT-4o"]


def test_the_issue_figures_hold():
    five_hundred = Estimate(GPT_4O, input_tokens=0, output_tokens=500, calls_per_day=1000)
    assert format_usd(five_hundred.per_day) == "$5.00" and format_usd(five_hundred.per_month) == "$150.00"
    one_hundred = Estimate(GPT_4O, input_tokens=0, output_tokens=100, calls_per_day=1000)
    assert one_hundred.per_day == Decimal("1") and one_hundred.per_month == Decimal("30")


def test_output_costs_four_times_input_and_cached_input_half():
    assert GPT_4O.cost(1_000_000) == Decimal("2.50")
    assert GPT_4O.cost(0, 1_000_000) == Decimal("1.25")
    assert GPT_4O.cost(0, 0, 1_000_000) == Decimal("10.00")
    turn = turn_cost(GPT_4O, prompt_tokens=2000, cached_tokens=1800, completion_tokens=100)
    assert (turn.input, turn.cached_input, turn.output) == (Decimal("0.0005"), Decimal("0.00225"), Decimal("0.001"))
    assert turn.total == Decimal("0.00375")


def test_a_prompt_below_the_providers_caching_minimum_is_all_fresh_input():
    """OpenAI caches only prompts of 1,024 tokens or more: a 45-token prompt is billed in full."""
    short = turn_cost(GPT_4O, prompt_tokens=45, cached_tokens=40, completion_tokens=10)
    assert short.cached_input == 0 and short.input == GPT_4O.cost(45)
    assert turn_cost(PRESETS["Claude Haiku 3.5"], 2047, 2000, 0).cached_input == 0
    assert turn_cost(PRESETS["Claude Haiku 3.5"], 2048, 2000, 0).cached_input > 0


def test_many_tiny_amounts_do_not_drift():
    total = sum((GPT_4O.cost(1, 0, 1) for _ in range(100_000)), Decimal(0))
    assert total == Decimal("1.25")


@pytest.mark.parametrize(
    ("amount", "shown"),
    [("0", "$0.00"), ("0.005", "$0.005000"), ("0.015", "$0.02"), ("0.0049", "$0.004900"), ("0.0000004", "$0.000000"),
     ("1234.565", "$1,234.57"), ("0.01", "$0.01")],
)
def test_cents_for_totals_more_digits_for_tiny_amounts(amount, shown):
    assert format_usd(Decimal(amount)) == shown


@pytest.mark.parametrize(("amount", "shown"), [("0", "$0.000000"), ("0.0057", "$0.005700"), ("0.0114", "$0.011400"),
                                               ("1234.5678905", "$1,234.567891")])
def test_figures_that_add_up_keep_one_format(amount, shown):
    assert format_usd(Decimal(amount), fine=True) == shown


def test_words_become_tokens_at_1_33():
    assert words_to_tokens(100) == 133 and words_to_tokens(3) == 4 and words_to_tokens(0) == 0


def test_presets_are_found_by_any_case_and_unknown_lists_them():
    assert find_preset(PRESETS, " gpt-4o ") is GPT_4O
    with pytest.raises(PricingError, match="unknown price preset 'gpt-5': choose one of GPT-4o, GPT-4o mini"):
        find_preset(PRESETS, "gpt-5")


def test_overrides_and_new_presets():
    house = {"input": "0.1", "output": "0.2", "read_on": "2026-11-01"}
    presets = presets_with({"GPT-4o": {"output": 12}, "House model": house})
    assert presets["GPT-4o"].output == Decimal("12") and presets["GPT-4o"].input == Decimal("2.50")
    house = presets["House model"]
    assert house.cached_input == Decimal("0.1") and house.read_on == "2026-11-01"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"X": {"input": 1}}, r"\[prices.X\] needs at least input and output"),
        ({"X": {"input": "cheap"}}, r"\[prices.X\] input must be a number of dollars \(got 'cheap'\)"),
        ({"GPT-4o": {"output": -1}}, "output must be zero or more dollars"),
        ({"GPT-4o": {"output": "lots"}}, "output must be a number of dollars"),
        ({"GPT-4o": {"outptu": 1}}, "unknown field 'outptu'"),
        ({"GPT-4o": 3}, "must be a table"),
    ],
)
def test_bad_price_tables_are_refused(table, message):
    with pytest.raises(PricingError, match=message):
        presets_with(table)


def test_config_chooses_and_overrides_prices(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('price = "house"\n[prices.House]\ninput = 0.5\noutput = 1.5\n')
    config = load_config(path)
    assert config.price == "House" and config.prices["House"].output == Decimal("1.5")
    path.write_text('price = "nope"\n')
    with pytest.raises(ConfigError, match="unknown price preset 'nope'"):
        load_config(path)
    path.write_text('prices = 3\n')
    with pytest.raises(ConfigError, match=r"\[prices\] must hold tables"):
        load_config(path)


def estimate(*args: str):
    return run_cli("estimate", *args)


def test_estimate_cli_text_and_json():
    text = estimate("--output-tokens", "500", "--calls", "1000", "--price", "GPT-4o")
    assert text.returncode == 0
    assert "per day          $5.00  (1,000 calls)" in text.stdout and "per month        $150.00" in text.stdout
    report = json.loads(estimate("--output-words", "75", "--input-tokens", "1000", "--calls", "10", "--json").stdout)
    assert report["output_tokens"] == 100 and report["input_tokens"] == 1000
    assert Decimal(report["cost_per_call"]) == Decimal("0.0035")
    assert Decimal(report["cost_per_month"]) == Decimal("1.05")


def test_estimate_counts_text_with_the_model_tokenizer(tiny, tiny_model, tmp_path):
    expected = tiny.count_tokens("Hello world Paris")
    report = json.loads(estimate("--text", "Hello world Paris", "--model", str(tiny_model), "--json").stdout)
    assert report["input_tokens"] == expected
    note = tmp_path / "prompt.txt"
    note.write_text("Hello world Paris")
    from_file = json.loads(estimate("--file", str(note), "--model", str(tiny_model), "--json").stdout)
    assert from_file["input_tokens"] == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--price", "gpt-9"], "unknown price preset 'gpt-9': choose one of GPT-4o"),
        (["--output-tokens", "-5"], "--output-tokens must be zero or more (got -5)"),
        (["--calls", "ten"], "--calls must be a whole number (got 'ten')"),
        (["--file", "/no/such/file.txt"], "cannot read /no/such/file.txt"),
        (["--text", "a", "--input-tokens", "3"], "not allowed with argument"),
        ([], "give the work of one call: its input (--text, --file or --input-tokens N) and/or its output"),
        (["--calls", "3", "--price", "GPT-4o"], "give the work of one call: its input"),
    ],
)
def test_estimate_bad_input_is_one_line(args, message):
    result = estimate(*args)
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.count("\n") == 1
