"""Workloads generate what they promise (no server needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infera_core.bench.trace import TRACE_BLOCK_TOKENS, BlockTokens, trace_workload
from infera_core.bench.workloads import (
    multi_turn_workload,
    poisson_arrivals,
    random_workload,
    shared_prefix_workload,
)
from infera_core.errors import ConfigError


def _write_trace(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trace_same_hash_id_gives_same_512_tokens(tmp_path: Path) -> None:
    trace = _write_trace(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]},
            {"timestamp": 1000, "input_length": 700, "output_length": 3, "hash_ids": [7, 11]},
            {"timestamp": 2500, "input_length": 600, "output_length": 2, "hash_ids": [12]},
        ],
    )
    sessions = trace_workload(trace)
    a, b, c = (s.turns[0].prompt for s in sessions)
    assert isinstance(a, list) and isinstance(b, list) and isinstance(c, list)
    assert [len(a), len(b), len(c)] == [1100, 700, 600]
    assert a[:TRACE_BLOCK_TOKENS] == b[:TRACE_BLOCK_TOKENS]  # hash id 7 shared
    assert a[TRACE_BLOCK_TOKENS : 2 * TRACE_BLOCK_TOKENS] != b[TRACE_BLOCK_TOKENS:]  # 8 vs 11
    # a row longer than its blocks is padded with tokens of its own
    assert c[:TRACE_BLOCK_TOKENS] == BlockTokens().block(12)
    assert c[TRACE_BLOCK_TOKENS:] != a[TRACE_BLOCK_TOKENS : TRACE_BLOCK_TOKENS + 88]
    # another run (another process) maps ids to the very same tokens
    assert trace_workload(trace)[0].turns[0].prompt == a
    assert all(10 <= t < 32000 for t in a)
    assert [s.turns[0].max_tokens for s in sessions] == [5, 3, 2]


def test_trace_timestamps_scale_and_limit(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 1000 * i, "input_length": 10, "output_length": 1, "hash_ids": [i]} for i in range(10)
    ]
    trace = _write_trace(tmp_path / "t.jsonl", rows)
    sessions = trace_workload(trace, max_requests=4, time_scale=0.5)
    assert [s.at for s in sessions] == pytest.approx([0.0, 0.5, 1.0, 1.5])
    assert all(s.api == "completions" for s in sessions)


def test_trace_bad_rows_name_the_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n{"oops": 1}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2"):
        trace_workload(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        trace_workload(tmp_path / "missing.jsonl")


def test_shared_prefix_structure() -> None:
    sessions = shared_prefix_workload(
        groups=4, prefix_len=50, questions_per_group=3, question_len=7, output_len=4
    )
    assert len(sessions) == 12
    by_group: dict[int, list[list[str]]] = {}
    for s in sessions:
        t = s.turns[0]
        assert isinstance(t.prompt, str) and t.group is not None
        words = t.prompt.split(" ")
        assert len(words) == 57
        by_group.setdefault(t.group, []).append(words)
    assert sorted(len(v) for v in by_group.values()) == [3, 3, 3, 3]
    prefixes = {g: {tuple(w[:50]) for w in v} for g, v in by_group.items()}
    assert all(len(p) == 1 for p in prefixes.values())  # one prefix per group
    assert len({next(iter(p)) for p in prefixes.values()}) == 4  # groups differ
    # questions differ inside a group
    assert all(len({tuple(w[50:]) for w in v}) == 3 for v in by_group.values())
    # groups are interleaved, not sent in blocks
    order = [s.turns[0].group or 0 for s in sessions]
    assert order != sorted(order)


def test_random_lengths_and_determinism() -> None:
    a = random_workload(50, input_len=100, output_len=10, range_ratio=0.5, seed=3)
    b = random_workload(50, input_len=100, output_len=10, range_ratio=0.5, seed=3)
    assert [s.turns[0].prompt for s in a] == [s.turns[0].prompt for s in b]
    lens = [len(str(s.turns[0].prompt).split(" ")) for s in a]
    assert min(lens) >= 50 and max(lens) <= 150 and len(set(lens)) > 5


def test_multi_turn_sessions_and_poisson() -> None:
    sessions = multi_turn_workload(
        sessions=3, turns=4, first_len=20, turn_len=5, output_len=3, think_time=0.1
    )
    assert [len(s.turns) for s in sessions] == [4, 4, 4]
    assert all(s.api == "chat" and s.think_time == 0.1 for s in sessions)
    assert [len(str(t.prompt).split(" ")) for t in sessions[0].turns] == [20, 5, 5, 5]
    poisson_arrivals(sessions, rate=10.0)
    ats = [s.at for s in sessions]
    assert ats[0] == 0.0 and ats == sorted(ats)  # type: ignore[type-var]
