"""What the same tokens would cost on a paid API.

Money is Decimal throughout: a session adds up thousands of sub-cent amounts, and binary floats
would drift. Prices are US dollars per 1M tokens, each with the date it was read.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

PER_TOKENS = Decimal(1_000_000)
WORDS_TO_TOKENS = Decimal("1.33")
DAYS_PER_MONTH = 30


class PricingError(ValueError):
    """A price or count that cannot be used; the message is user-facing."""


@dataclass(frozen=True, slots=True)
class Price:
    name: str
    input: Decimal
    cached_input: Decimal
    output: Decimal
    read_on: str
    cache_min_tokens: int = 0  # a prompt shorter than this is never cached by the provider: all fresh input

    def cost(self, input_tokens: int, cached_tokens: int = 0, output_tokens: int = 0) -> Decimal:
        """`input_tokens` are billed as fresh input, `cached_tokens` at the cached-input rate."""
        return (
            self.input * input_tokens + self.cached_input * cached_tokens + self.output * output_tokens
        ) / PER_TOKENS


@dataclass(frozen=True, slots=True)
class TurnCost:
    """One turn's bill, split the way the APIs bill it."""

    input: Decimal
    cached_input: Decimal
    output: Decimal

    @property
    def total(self) -> Decimal:
        return self.input + self.cached_input + self.output


def turn_cost(price: Price, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> TurnCost:
    """The provider's rule decides what counts as cached: below its minimum prompt, nothing does."""
    if prompt_tokens < price.cache_min_tokens:
        cached_tokens = 0
    return TurnCost(
        input=price.cost(prompt_tokens - cached_tokens),
        cached_input=price.cost(0, cached_tokens),
        output=price.cost(0, 0, completion_tokens),
    )


def _preset(name: str, input_: str, cached: str, output: str, read_on: str, cache_min_tokens: int) -> Price:
    return Price(name, Decimal(input_), Decimal(cached), Decimal(output), read_on, cache_min_tokens)


# List prices per 1M tokens (input, cached input, output), and the shortest prompt each provider caches:
# OpenAI 1,024 tokens; Anthropic 1,024 (Sonnet) and 2,048 (Haiku); Gemini 2.0 Flash 4,096.
PRESETS: dict[str, Price] = {
    price.name: price
    for price in (
        _preset("GPT-4o", "2.50", "1.25", "10.00", "2025-06-01", 1024),
        _preset("GPT-4o mini", "0.15", "0.075", "0.60", "2025-06-01", 1024),
        _preset("GPT-4.1", "2.00", "0.50", "8.00", "2025-06-01", 1024),
        _preset("GPT-4.1 mini", "0.40", "0.10", "1.60", "2025-06-01", 1024),
        _preset("Claude Sonnet 4", "3.00", "0.30", "15.00", "2025-06-01", 1024),
        _preset("Claude Haiku 3.5", "0.80", "0.08", "4.00", "2025-06-01", 2048),
        _preset("Gemini 2.0 Flash", "0.10", "0.025", "0.40", "2025-06-01", 4096),
    )
}
DEFAULT_PRESET = "GPT-4o"


def money(value: Any, what: str) -> Decimal:
    """A non-negative price from config or the command line."""
    if isinstance(value, bool):
        raise PricingError(f"{what} must be a number of dollars (got {value!r})")
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise PricingError(f"{what} must be a number of dollars (got {value!r})") from None
    if not amount.is_finite() or amount < 0:
        raise PricingError(f"{what} must be zero or more dollars (got {value})")
    return amount


def count(value: object, what: str) -> int:
    """A non-negative whole number of tokens, words or calls."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        try:
            number = int(str(value))
        except ValueError:
            raise PricingError(f"{what} must be a whole number (got {value!r})") from None
    if number < 0:
        raise PricingError(f"{what} must be zero or more (got {number})")
    return number


def presets_with(overrides: dict[str, Any]) -> dict[str, Price]:
    """The shipped presets, with the user's `[prices.NAME]` tables added or laid over them."""
    presets = dict(PRESETS)
    for name, table in overrides.items():
        if not isinstance(table, dict):
            raise PricingError(f"[prices.{name}] must be a table of input, cached_input, output")
        unknown = sorted(set(table) - {"input", "cached_input", "output", "read_on", "cache_min_tokens"})
        if unknown:
            raise PricingError(f"[prices.{name}]: unknown field {unknown[0]!r}")
        for field in ("input", "cached_input", "output"):  # a wrong value is named before a missing one
            if field in table:
                money(table[field], f"[prices.{name}] {field}")
        base = presets.get(name)
        if base is None:
            if not {"input", "output"} <= set(table):
                raise PricingError(f"[prices.{name}] needs at least input and output prices")
            fresh = money(table["input"], f"[prices.{name}] input")  # a new preset's cached input costs as much
            base = Price(name, fresh, fresh, money(table["output"], f"[prices.{name}] output"), "set in config")
        fresh = money(table["input"], f"[prices.{name}] input") if "input" in table else base.input
        presets[name] = Price(
            name,
            fresh,
            money(table["cached_input"], f"[prices.{name}] cached_input") if "cached_input" in table
            else base.cached_input,
            money(table["output"], f"[prices.{name}] output") if "output" in table else base.output,
            str(table.get("read_on", base.read_on)),
            count(table["cache_min_tokens"], f"[prices.{name}] cache_min_tokens") if "cache_min_tokens" in table
            else base.cache_min_tokens,
        )
    return presets


def find_preset(presets: dict[str, Price], name: str) -> Price:
    for key, price in presets.items():
        if key.lower() == name.strip().lower():
            return price
    raise PricingError(f"unknown price preset {name!r}: choose one of {', '.join(presets)}")


def words_to_tokens(words: int) -> int:
    return int((WORDS_TO_TOKENS * words).to_integral_value(rounding=ROUND_HALF_UP))


def format_usd(amount: Decimal, *, fine: bool = False) -> str:
    """Cents for sums a person pays; more digits where a single reply costs a fraction of a cent. `fine`:
    six decimals whatever the amount, for figures shown together that must add up (the panel's replies
    and the session's total, which would otherwise switch to cents while the replies keep six)."""
    if not fine and (amount == 0 or abs(amount) >= Decimal("0.01")):
        return f"${amount.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP):,}"
    return f"${amount.quantize(Decimal('0.000001'), rounding=ROUND_HALF_UP):,}"


@dataclass(frozen=True, slots=True)
class Estimate:
    """What a workload would cost on a paid API, per call, per day and per month (`tui-chat estimate`)."""

    price: Price
    input_tokens: int
    output_tokens: int
    calls_per_day: int

    @property
    def per_call(self) -> Decimal:
        return self.price.cost(self.input_tokens, 0, self.output_tokens)

    @property
    def per_day(self) -> Decimal:
        return self.per_call * self.calls_per_day

    @property
    def per_month(self) -> Decimal:
        return self.per_day * DAYS_PER_MONTH

    def as_dict(self) -> dict[str, object]:
        """Money as exact decimal strings: a float would round away the point of Decimal."""
        return {
            "price": {
                "name": self.price.name,
                "input_per_1m": str(self.price.input),
                "cached_input_per_1m": str(self.price.cached_input),
                "output_per_1m": str(self.price.output),
                "read_on": self.price.read_on,
            },
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "calls_per_day": self.calls_per_day,
            "cost_per_call": str(self.per_call),
            "cost_per_day": str(self.per_day),
            "cost_per_month": str(self.per_month),
        }

    def as_text(self) -> str:
        p = self.price
        return (
            f"{p.name} per 1M tokens: {format_usd(p.input)} input · {format_usd(p.cached_input)} cached input · "
            f"{format_usd(p.output)} output (prices read {p.read_on})\n"
            f"tokens per call  {self.input_tokens:,} in · {self.output_tokens:,} out\n"
            f"per call         {format_usd(self.per_call)}\n"
            f"per day          {format_usd(self.per_day)}  "
            f"({self.calls_per_day:,} call{'' if self.calls_per_day == 1 else 's'})\n"
            f"per month        {format_usd(self.per_month)}  ({DAYS_PER_MONTH} days)\n"
        )
