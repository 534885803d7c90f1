"""SGLang flags for DP-attention and for decode workers' KV events (pure functions of the launch).

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
"""

from __future__ import annotations

from infera_core.engines.base import LaunchContext
from infera_core.errors import EngineError
from infera_core.worker import Role

DECODE_RADIX_FLAG = "--disaggregation-decode-enable-radix-cache"
RADIX_INCOMPATIBLE = ("--disable-radix-cache", "--speculative-algorithm", "--enable-hisparse")
"""Engine flags with which SGLang refuses the decode radix cache (or which turn it off)."""


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


def decode_radix_flags(ctx: LaunchContext) -> list[str]:
    """``--disaggregation-decode-enable-radix-cache`` for a decode worker (its KV events), unless
    the user set it already or gave a flag SGLang refuses it with."""
    if ctx.role is not Role.DECODE:
        return []
    names = {arg.split("=", 1)[0] for arg in ctx.engine_args}
    if DECODE_RADIX_FLAG in names or names.intersection(RADIX_INCOMPATIBLE):
        return []
    return [DECODE_RADIX_FLAG]
