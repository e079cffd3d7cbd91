"""Token-id prompts (the tiny models have no tokenizer): seeded, reproducible, the same in every process."""

from __future__ import annotations

import random

#: The correctness prompts' lengths: below, near and far beyond the top-k of 2048.
CORRECTNESS_LENGTHS = (17, 300, 2500, 5000, 16000)
FIRST_TOKEN_ID = 2  # 0 and 1 are bos / eos


def random_prompt(length: int, *, seed: int, vocab: int = 2048) -> list[int]:
    """``length`` token ids in [2, vocab), drawn from ``random.Random(seed)``."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    rng = random.Random(seed)
    return [rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(length)]


def repetitive_prompt(length: int, *, seed: int, period: int = 37, vocab: int = 2048) -> list[int]:
    """A prompt that repeats a ``period``-token phrase: the n-gram speculator finds matches to propose."""
    phrase = random_prompt(period, seed=seed, vocab=vocab)
    return [phrase[i % period] for i in range(length)]


def prompt_set(lengths: tuple[int, ...] = CORRECTNESS_LENGTHS, *, seed: int = 0, kind: str = "random") -> list[list[int]]:
    """One prompt per length (seed ``seed + i``); ``kind`` is ``random`` or ``repetitive``."""
    make = {"random": random_prompt, "repetitive": repetitive_prompt}.get(kind)
    if make is None:
        raise ValueError(f"kind must be 'random' or 'repetitive', got {kind!r}")
    return [make(n, seed=seed + i) for i, n in enumerate(lengths)]
