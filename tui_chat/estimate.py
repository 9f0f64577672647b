"""`tui-chat estimate`: what a workload would cost on a paid API, per call, per day and per month."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from .pricing import DAYS_PER_MONTH, Price, format_usd


@dataclass(frozen=True, slots=True)
class Estimate:
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
            f"per day          {format_usd(self.per_day)}  ({self.calls_per_day:,} call{'' if self.calls_per_day == 1 else 's'})\n"
            f"per month        {format_usd(self.per_month)}  ({DAYS_PER_MONTH} days)\n"
        )
