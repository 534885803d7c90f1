"""SGLang flags for data parallel and for decode workers' KV events (pure functions of the launch).

* ``--dp-mode attention`` (the default): ``--dp-size N`` is one SGLang server fronting N
  DP-attention ranks (below). ``--dp-mode plain``: SGLang's plain data parallel, N full model
  replicas, each run by its own launcher (``--dp-rank K``) as an ordinary worker the router
  balances. One SGLang server cannot front N plain-DP ranks under Infera: without DP-attention
  every rank's ``attn_dp_rank`` is 0 (``compute_dp_attention_world_info``), so all N ranks'
  KV event publishers (``EventPublisherFactory.create(config, attn_dp_rank)``) bind the same
  port and the second rank fails to start; such a launch is refused with one line. Replica K
  starts on GPU ``K × tp × pp × gpu-id-step`` (``--base-gpu-id``), the placement SGLang's own
  ``launch_dp_schedulers`` gives rank K.

* ``--dp-size N`` (N > 1) adds ``--enable-dp-attention`` and a ``--tp-size``: SGLang requires
  ``tp_size % dp_size == 0`` (``ServerArgs`` checks it), and DP-attention splits the TP group
  into N attention ranks, so without a ``--tp`` the tensor-parallel size is N. A ``--tp`` that
  is not a multiple of N is refused here, with one line, before SGLang would.
* A decode worker (``--disaggregation-mode decode``) runs without a radix cache unless
  ``--disaggregation-decode-enable-radix-cache`` is set (``server_args.py``), and then publishes
  no KV events. Infera's SGLang workers always publish KV events, so decode workers get the flag
  — except where SGLang refuses the combination (``--disable-radix-cache``, speculative decoding,
  ``--enable-hisparse``): there the decode worker keeps SGLang's default and its view stays
  empty. (SGLang's ``fake`` transfer backend, which refuses it too, is refused by the transfer
  plan before this runs: ``--transfer-backend fake`` is no Infera transfer backend.)
* Decode context parallelism (``--dcp-size``/``--decode-context-parallel-size`` N > 1): SGLang
  releases up to and including 0.5.x refuse the decode radix cache with it (PD decode under DCP
  is forced onto a chunk cache; the gate was lifted only by SGLang PR #40263, September 2026),
  so a DCP decode worker does not get the flag either. A user on an SGLang that accepts the
  combination passes ``--disaggregation-decode-enable-radix-cache`` after ``--`` themselves.
"""

from __future__ import annotations

from infera_core.engines.base import LaunchContext
from infera_core.errors import EngineError
from infera_core.worker import Role

DECODE_RADIX_FLAG = "--disaggregation-decode-enable-radix-cache"
RADIX_INCOMPATIBLE = ("--disable-radix-cache", "--speculative-algorithm", "--enable-hisparse")
"""Engine flags with which SGLang refuses the decode radix cache (or which turn it off)."""
DCP_FLAGS = ("--dcp-size", "--decode-context-parallel-size")
DP_ATTENTION = "attention"
DP_PLAIN = "plain"
DP_MODES = (DP_ATTENTION, DP_PLAIN)
PP_FLAGS = ("--pp-size", "--pipeline-parallel-size")
BASE_GPU_FLAG = "--base-gpu-id"
"""SGLang's decode-context-parallel size (``ServerArgs.dcp_size`` and its alias)."""


def tp_size(ctx: LaunchContext, dp: int) -> int:
    """The ``--tp-size`` to launch with: ``--tp``, or the DP size under DP-attention."""
    tp = int(ctx.options.get("tp") or 1)
    if dp <= 1:
        return tp
    if tp == 1:  # absent (an explicit 1 is no valid DP-attention layout either)
        return dp
    if tp % dp:
        raise EngineError(
            f"--tp {tp} with --dp-size {dp}: SGLang DP-attention needs the tensor-parallel size to be "
            f"a multiple of the DP size (tp_size % dp_size == 0); drop --tp to use {dp}"
        )
    return tp


def parallel_flags(ctx: LaunchContext, dp: int) -> list[str]:
    """``--tp-size`` (when not 1) and, for ``dp`` > 1, ``--dp-size dp --enable-dp-attention``."""
    tp = tp_size(ctx, dp)
    flags = ["--tp-size", str(tp)] if tp != 1 else []
    if dp > 1:
        flags += ["--dp-size", str(dp), "--enable-dp-attention"]
    return flags


def engine_flag_value(engine_args: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the last of ``names`` in ``engine_args`` (``--flag V`` or ``--flag=V``)."""
    value = None
    for i, arg in enumerate(engine_args):
        name, eq, inline = arg.partition("=")
        if name in names:
            value = inline if eq else (engine_args[i + 1] if i + 1 < len(engine_args) else None)
    return value


def dcp_size(engine_args: list[str]) -> int:
    """SGLang's ``--dcp-size`` from the engine flags (1 when absent or not a number)."""
    raw = engine_flag_value(engine_args, DCP_FLAGS)
    try:
        return int(raw) if raw is not None else 1
    except ValueError:
        return 1  # SGLang's own parser reports it


def dp_mode(ctx: LaunchContext) -> str:
    """``--dp-mode``: ``attention`` (default) or ``plain``; one error line otherwise."""
    mode = str(ctx.options.get("dp_mode") or DP_ATTENTION)
    if mode not in DP_MODES:
        raise EngineError(f"--dp-mode {mode}: expected one of {', '.join(DP_MODES)}")
    return mode


def plain_dp_flags(ctx: LaunchContext, rank: int | None) -> list[str]:
    """``--base-gpu-id`` for plain-DP replica ``rank`` (none when the user placed it)."""
    if rank is None or engine_flag_value(list(ctx.engine_args), (BASE_GPU_FLAG,)) is not None:
        return []
    tp = int(ctx.options.get("tp") or 1)
    pp = _int(engine_flag_value(list(ctx.engine_args), PP_FLAGS))
    step = _int(engine_flag_value(list(ctx.engine_args), ("--gpu-id-step",)))
    return [BASE_GPU_FLAG, str(rank * tp * pp * step)]


def _int(raw: str | None) -> int:
    try:
        return max(1, int(raw)) if raw is not None else 1
    except ValueError:
        return 1  # SGLang's own parser reports it


def decode_radix_flags(ctx: LaunchContext) -> list[str]:
    """``--disaggregation-decode-enable-radix-cache`` for a decode worker (its KV events), unless
    the user set it already or gave a flag SGLang refuses it with (``--dcp-size`` > 1 among them)."""
    if ctx.role is not Role.DECODE:
        return []
    names = {arg.split("=", 1)[0] for arg in ctx.engine_args}
    if DECODE_RADIX_FLAG in names or names.intersection(RADIX_INCOMPATIBLE):
        return []
    if dcp_size(list(ctx.engine_args)) > 1:
        return []
    return [DECODE_RADIX_FLAG]
