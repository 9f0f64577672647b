"""How the inspector draws what it asked the model: the X-ray as a strip of bars, one per stage of the
chain in order (candidates kept, the share of the raw distribution they hold, where the drawn token
ranks), and a word's exact probability beside the top alternatives. Model text is shown literally."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from ...engine.base import Candidate, GrammarMask, WordProbability, XRay
from ...safetext import quoted, screen_safe

BAR_WIDTH = 16
LABEL_WIDTH = 20




def bar(prob: float, width: int = BAR_WIDTH) -> str:
    eighths = round(prob * width * 8)
    full, part = divmod(eighths, 8)
    return ("█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "")).ljust(width)


def percent(prob: float) -> str:
    """A probability as a percentage that stays readable far down the tail (1.2e-05 rather than 0.0%)."""
    return f"{prob:.1%}" if prob >= 0.001 else f"{prob:.1e}"


def xray_text(xray: XRay, note: str = "", recorded: float | None = None) -> Text:
    """The strip of bars and the verdict; `note` says what the figures assume (older settings). `recorded`:
    the probability the reply recorded as it drew the token, said beside the recomputed one where they part."""
    out = Text(f"X-ray of {quoted(xray.piece)}: the chain stage by stage ({xray.elapsed_s * 1000:.0f} ms)\n",
               style="bold")
    out.append(f"{'stage':<{LABEL_WIDTH}} {'kept':>7}  {'share of raw p kept':<{BAR_WIDTH + 9}}rank · p among kept\n",
               style="dim")
    for stage in xray.stages:
        prob = stage.prob
        removed = prob is None  # with its rank: the stage removed the drawn token
        out.append(f"{stage.label:<{LABEL_WIDTH}.{LABEL_WIDTH}} {stage.kept:>7,}  ")
        out.append(bar(stage.mass), style="dim" if removed else "green")
        out.append(f" {percent(stage.mass):>6}  ")
        out.append("removed it" if prob is None else f"{stage.rank} · p {percent(prob)}",
                   style="bold red" if removed else "")
        out.append("\n")
        if stage.note:
            out.append(f"  ↳ {stage.note}\n", style="dim italic")
    if not xray.stages:
        out.append("no stage cut the pool: the draw saw every candidate\n", style="dim")
    out.append(screen_safe(xray.verdict), style="bold")
    for line in (note, drift_note(recorded, xray.prob)):
        if line:
            out.append(f"\n({line})", style="dim")
    return out


def drift_note(recorded: float | None, recomputed: float) -> str:
    """Where a recomputed probability is not the one recorded at the draw, both, and why: llama.cpp's figures
    move with how a position was computed (a reply's first token is read in one batch with the prompt; a
    chat restored from disk holds its cache in another layout), by a few percent of themselves on a small model."""
    if recorded is None or abs(recomputed - recorded) <= max(1e-4, 0.01 * recorded):
        return ""
    return (f"recomputed p = {percent(recomputed)}; the reply recorded {percent(recorded)} when it drew it: "
            "llama.cpp's figures move a little with how the position was computed (read with the prompt, or "
            "after the cache came back from disk)")


def word_text(asked: WordProbability, top: Sequence[Candidate]) -> Text:
    """A word's exact probability at this position, in the candidates' columns; for several tokens, the
    product of each one's probability after the ones before it."""
    line = Text("?   ▷ ", style="bold")
    line.append(f"{quoted(asked.text):<16.16}", style="bold")
    line.append(f" {bar(asked.prob)} ", style="cyan")
    line.append(f"{percent(asked.prob):>6}  rank {asked.rank:,}")
    if asked.rank > len(top):
        line.append(f" (not top {len(top)})", style="dim")
    if len(asked.tokens) > 1:
        parts = " × ".join(f"{quoted(part.text)} {percent(part.prob)}" for part in asked.tokens)
        line.append(f"\n    = {parts}", style="dim")
    return line


def grammar_summary(mask: GrammarMask, where: str = "") -> str:
    """What an output format's grammar did at one token, in the words the heatmap and the inspector share."""
    did = "forced: it left one choice" if mask.forced else f"it allowed {mask.allowed:,}"
    return f"grammar removed {percent(mask.removed)} of the probability{where} · {did}"


def grammar_text(mask: GrammarMask | None) -> Text:
    """The inspector's line for it, or nothing without a format."""
    return Text() if mask is None else Text(f"\nThe output format's {grammar_summary(mask, ' here')}")
