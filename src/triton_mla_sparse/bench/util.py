"""Small text helpers shared by the bench modules."""

from __future__ import annotations


def short_exc(e: BaseException, limit: int = 300) -> str:
    """``"Type: message"`` on one line, cut to ``limit`` characters."""
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fmt(x: float | None, spec: str, none: str = "-") -> str:
    """``format(x, spec)``, or ``none`` when ``x`` is None."""
    return none if x is None else format(x, spec)
