"""ATOM's parallel sizes and the ports one ATOM launch needs, picked once per launch.

Checked against ROCm/ATOM ``main`` at ffdf3bb5:

* ``-dp``/``--data-parallel-size`` and ``-pp``/``--pipeline-parallel-size`` are ATOM's own
  flags (``atom/model_engine/arg_utils.py``), passed after ``--``. With ``-dp N`` one
  OpenAI server fronts N engine cores (``atom/model_engine/engine_core_mgr.py``), each with
  its own KV cache: the worker record says ``dp_size: N`` (no ``dp_rank``).
* ATOM has no ``--data-parallel-master-port`` flag: the DP ranks' gloo rendezvous
  (``ParallelConfig.stateless_init_dp_group``, ``atom/config.py``) uses
  ``data_parallel_master_port``, default **29500**, set only from the environment variable
  ``ATOM_DP_MASTER_PORT`` (``atom/utils/envs.py``; ATOM's own two-servers-per-node PD script,
  ``.github/scripts/atomesh/pd_server_atom.sh``, sets it per server). Two ``-dp`` ATOM
  workers on one host would both take 29500, so Infera gives each a free port there
  (``--dp-master-port`` fixes it; an ``ATOM_DP_MASTER_PORT`` already in the launcher's
  environment is the user's and is left alone). ``data_parallel_base_port`` needs nothing:
  ATOM picks a free one per process (``get_open_port()``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from infera_core.engines.support import free_ports
from infera_core.errors import EngineError

if TYPE_CHECKING:
    from infera_core.engines.base import LaunchContext

ENGINE_SIZES = {"dp": ("--data-parallel-size", "-dp"), "pp": ("--pipeline-parallel-size", "-pp")}
"""ATOM's own parallel sizes, passed after ``--`` (``atom/model_engine/arg_utils.py``)."""
DP_MASTER_ENV = "ATOM_DP_MASTER_PORT"
"""ATOM's DP rendezvous port (``atom/utils/envs.py``, default 29500); no CLI flag sets it."""


def engine_size(ctx: LaunchContext, kind: str) -> int:
    """ATOM's ``-dp``/``-pp`` from the engine flags (1 when absent; one error line when bad)."""
    names = ENGINE_SIZES[kind]
    args = list(ctx.engine_args)
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in names:
            raw = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if not raw.isdigit() or int(raw) < 1:
                raise EngineError(f"{name} {raw}: expected a positive number")
            return int(raw)
    return 1


def dp_size(ctx: LaunchContext) -> int:
    """How many DP ranks (engine cores) this ATOM server runs (``-dp``, 1 when absent)."""
    return engine_size(ctx, "dp")


def launch_port(ctx: LaunchContext, key: str, option: str, count: int = 1) -> int:
    """The ``option``'s port, else a free one (the first of ``count`` consecutive ones when
    ``count`` > 1); picked once per launch and kept in ``ctx.ports[key]``."""
    port = ctx.ports.get(key)
    if port is None:
        wanted = int(ctx.options.get(option) or 0)
        port = ctx.ports[key] = wanted or free_ports(ctx, count, consecutive=count > 1)[0]
    return port


def dp_master_env(ctx: LaunchContext) -> dict[str, str]:
    """``ATOM_DP_MASTER_PORT`` for a ``-dp`` > 1 launch: ``--dp-master-port``, else the user's
    own variable (nothing to set), else a free port picked once per launch."""
    if dp_size(ctx) <= 1:
        return {}
    if not ctx.options.get("dp_master_port") and DP_MASTER_ENV in os.environ:
        return {}
    return {DP_MASTER_ENV: str(launch_port(ctx, "atom_dp_master", "dp_master_port"))}
