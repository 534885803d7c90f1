"""Shared adapter helpers: ports, metrics parsing, host brackets, DP layout."""

from __future__ import annotations

import pytest

from infera_core.engines.base import EngineOption, FlagAlias, LaunchContext, LaunchSpec
from infera_core.engines.support import AdapterBase, bracket_host, dp_layout, free_ports, metrics_sum
from infera_core.errors import EngineError
from infera_core.testing.contracts import sample_launch_context


def test_free_ports_are_distinct_even_when_the_allocator_repeats() -> None:
    answers = iter([5000, 5000, 5001, 5001, 5002])
    ctx = sample_launch_context(free_port=lambda: next(answers))
    assert free_ports(ctx, 3) == [5000, 5001, 5002]


def test_consecutive_ports_are_all_free_right_now() -> None:
    ctx = sample_launch_context(free_port=lambda: 0)  # 0: the helper binds its own
    ports = free_ports(ctx, 4, consecutive=True)
    assert ports == list(range(ports[0], ports[0] + 4))


def test_metrics_sum_adds_every_labelled_sample_of_the_named_metrics() -> None:
    text = "\n".join(
        [
            "# TYPE sglang:num_running_reqs gauge",
            'sglang:num_running_reqs{model_name="a b",dp="0"} 2',
            'sglang:num_running_reqs{model_name="a b",dp="1"} 3',
            "sglang:num_queue_reqs 4.0",
            "sglang:num_queue_reqs_total 100",
        ]
    )
    assert metrics_sum(text, ["sglang:num_running_reqs", "sglang:num_queue_reqs"]) == 9
    assert metrics_sum(text, ["vllm:num_requests_running"]) is None


def test_bracket_host() -> None:
    assert bracket_host("fd00::1") == "[fd00::1]"
    assert bracket_host("[fd00::1]") == "[fd00::1]"
    assert bracket_host("10.0.0.1") == "10.0.0.1"


def test_dp_layout_prefers_the_launcher_then_the_adapter_flags() -> None:
    assert dp_layout(sample_launch_context(dp_size=4, dp_rank=3)) == (3, 4)
    assert dp_layout(sample_launch_context(options={"dp_size": 2, "dp_rank": 1})) == (1, 2)
    assert dp_layout(sample_launch_context()) == (None, 1)
    with pytest.raises(EngineError, match="--dp-rank 5"):
        dp_layout(sample_launch_context(options={"dp_size": 2, "dp_rank": 5}))


class _Toy(AdapterBase):
    name = "toy"
    engine_options = (EngineOption("slots", int, 4, "Slots."),)
    aliases = {"--parallel": FlagAlias("--slots")}
    managed_flags = {"--listen-port": "infera's --port"}

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        return LaunchSpec(argv=["toy", *ctx.engine_args])


def test_adapter_base_answers_from_its_class_attributes_and_refuses_managed_flags() -> None:
    toy = _Toy()
    assert [o.name for o in toy.options()] == ["slots"] and set(toy.flag_aliases()) == {"--parallel"}
    assert toy.build_launch(sample_launch_context(engine_args=["--x", "1"])).argv == ["toy", "--x", "1"]
    with pytest.raises(EngineError, match=r"--listen-port is set by Infera; use infera's --port"):
        toy.build_launch(sample_launch_context(engine_args=["--listen-port=9000"]))
