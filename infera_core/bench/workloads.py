"""Text workloads: what to send, independent of how it is sent.

A workload is a list of :class:`Session` objects. A session is one or more
:class:`Turn` objects sent one after another (multi-turn conversations); every
other workload uses single-turn sessions. Prompts are space-separated words drawn
from a fixed vocabulary of short lowercase words, so that one word is one token
under the sim's tokenizer and prompt lengths are predictable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

Api = Literal["completions", "chat"]

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def vocabulary() -> list[str]:
    """The words prompts are made of (deterministic; 2-syllable lowercase words)."""
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    return [a + b for a in syllables for b in syllables]


@dataclass(slots=True)
class Turn:
    """One request: a prompt (text or token ids) and how many tokens to generate."""

    prompt: str | list[int]
    max_tokens: int
    group: int | None = None
    """Shared-prefix group (for reports); None for other workloads."""


@dataclass(slots=True)
class Session:
    """Turns sent one after another; each turn's prompt extends the conversation."""

    turns: list[Turn]
    at: float | None = None
    """Arrival offset in seconds from the start (open loop); None → as soon as possible."""
    think_time: float = 0.0
    """Seconds to wait between a response and the session's next turn."""
    api: Api = "completions"
    session_id: int = 0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return len(self.turns)


class WordSource:
    """Deterministic random words for a seed."""

    __slots__ = ("_rng", "_words")

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._words = vocabulary()

    def text(self, n: int) -> str:
        return " ".join(self._rng.choices(self._words, k=max(0, n)))

    def length(self, mean: int, range_ratio: float) -> int:
        lo = max(1, round(mean * (1 - range_ratio)))
        hi = max(lo, round(mean * (1 + range_ratio)))
        return self._rng.randint(lo, hi)

    def shuffle(self, items: list[Session]) -> None:
        self._rng.shuffle(items)


def random_workload(
    num_requests: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    seed: int = 0,
    api: Api = "completions",
) -> list[Session]:
    """Independent prompts of ``input_len`` words (± ``range_ratio``)."""
    src = WordSource(seed)
    out: list[Session] = []
    for i in range(num_requests):
        n_in = src.length(input_len, range_ratio)
        n_out = src.length(output_len, range_ratio)
        out.append(Session([Turn(src.text(n_in), n_out)], api=api, session_id=i))
    return out


def shared_prefix_workload(
    groups: int,
    prefix_len: int,
    questions_per_group: int,
    question_len: int,
    output_len: int,
    seed: int = 0,
    api: Api = "completions",
    shuffle: bool = True,
) -> list[Session]:
    """``groups`` × ``questions_per_group`` prompts: a group's prefix, then a question.

    Requests are shuffled (deterministically) so groups interleave the way users do.
    """
    src = WordSource(seed)
    prefixes = [src.text(prefix_len) for _ in range(groups)]
    out: list[Session] = []
    for g, prefix in enumerate(prefixes):
        for _ in range(questions_per_group):
            prompt = f"{prefix} {src.text(question_len)}" if prefix_len else src.text(question_len)
            out.append(Session([Turn(prompt, output_len, group=g)], api=api))
    if shuffle:
        src.shuffle(out)
    for i, s in enumerate(out):
        s.session_id = i
    return out


def multi_turn_workload(
    sessions: int,
    turns: int,
    first_len: int,
    turn_len: int,
    output_len: int,
    think_time: float = 0.0,
    seed: int = 0,
    api: Api = "chat",
    system_len: int = 0,
) -> list[Session]:
    """Conversations of ``turns`` user messages; the runner sends the whole history each turn.

    The first user message has ``first_len`` words (after an optional shared system
    prompt of ``system_len`` words), later ones ``turn_len``.
    """
    src = WordSource(seed)
    system = src.text(system_len) if system_len else ""
    out: list[Session] = []
    for i in range(sessions):
        msgs = [Turn(src.text(first_len if t == 0 else turn_len), output_len) for t in range(turns)]
        extra: dict[str, object] = {"system": system} if system else {}
        out.append(Session(msgs, think_time=think_time, api=api, session_id=i, extra=extra))
    return out


def poisson_arrivals(sessions: list[Session], rate: float, seed: int = 0) -> None:
    """Give sessions Poisson arrival offsets at ``rate`` per second (open loop)."""
    rng = random.Random(seed ^ 0x5EED)
    t = 0.0
    for s in sessions:
        s.at = t
        t += rng.expovariate(rate)
