"""What the same tokens would cost on a paid API. Decimal money: sums of tiny amounts must not drift."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

PER_TOKENS = Decimal(1_000_000)


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per 1M tokens, as listed on `read_on`."""

    name: str
    input: Decimal
    cached_input: Decimal
    output: Decimal
    read_on: str

    def cost(self, input_tokens: int, cached_tokens: int, output_tokens: int) -> Decimal:
        """`input_tokens` are billed fresh, `cached_tokens` at the cached rate."""
        return (
            self.input * input_tokens + self.cached_input * cached_tokens + self.output * output_tokens
        ) / PER_TOKENS


GPT_4O = Price("GPT-4o", Decimal("2.50"), Decimal("1.25"), Decimal("10.00"), "2026-11-23")


def format_usd(amount: Decimal) -> str:
    """Cents for sums a person pays; more digits where a single reply costs a fraction of a cent."""
    if amount == 0 or abs(amount) >= Decimal("0.01"):
        return f"${amount.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP):,}"
    return f"${amount.quantize(Decimal('0.000001'), rounding=ROUND_HALF_UP)}"
