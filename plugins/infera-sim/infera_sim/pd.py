"""PD disaggregation between sim processes, in both request shapes of WIRE_FORMATS.md.

* **vllm-nixl** (serial): a request whose ``kv_transfer_params.do_remote_decode`` is
  true is a prefill leg; its response carries top-level ``kv_transfer_params`` with
  ``do_remote_prefill: true`` and where to pull the KV from. A request carrying those
  params is a decode leg: the sim checks them, pulls the prompt's KV from the prefill
  sim (``GET /sim/kv/<remote_request_id>`` on its transfer port), waits the transfer
  time, stores the blocks (``BlockStored`` events) and decodes.
* **vllm-moriio** / **vllm-moriio-read** (vLLM's MoRIIOConnector, WRITE / READ mode): both
  legs carry the router-made ``transfer_id``; the decode leg names the prefill's MoRI-IO
  address (``remote_host``, ``remote_notify_port``). The prefill publishes the transfer's KV
  when its prefill finishes (READ mode: it also answers vLLM's ``kv_transfer_params``); the
  decode long-polls ``GET /sim/moriio/<transfer_id>`` on that notify port, then proceeds as
  above.
* **vllm-mooncake** (vLLM's MooncakeConnector, concurrent): both legs carry the router-made
  ``transfer_id``; the decode leg names the prefill's ``remote_engine_id`` and
  ``remote_bootstrap_addr``. As vLLM's decode does, it asks that bootstrap server
  (``GET /query``: ``{dp_rank: {engine_id, worker_addr}}``) for the engine and fails the request
  when the id is not there: under data parallel the prefill registers ``<engine-id>_dp<rank>``.
  Then it long-polls ``GET /sim/mooncake/<transfer_id>`` there for the prefill's KV.
* **sglang-bootstrap** (concurrent): both legs carry ``bootstrap_host/port/room``.
  A prefill-role sim publishes the room's KV when its prefill finishes; a decode-role
  sim long-polls ``GET /sim/bootstrap/<room>`` on the prefill's bootstrap port, then
  proceeds as above.

Transfer time = tokens × ``--kv-bytes-per-token`` / ``--transfer-gbps``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any

import aiohttp
from aiohttp import web

from infera_sim.config import SimConfig
from infera_sim.openai_api import ApiError
from infera_sim.request import SimRequest

log = logging.getLogger("infera_sim.pd")
_KEEP = 4096


class PdManager:
    """PD state of one sim: KV kept for decode legs, bootstrap rooms, the transfer server."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.transfers: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.rooms: OrderedDict[int, asyncio.Future[list[int]]] = OrderedDict()
        self.moriio: OrderedDict[str, asyncio.Future[list[int]]] = OrderedDict()
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- transfer / bootstrap server (prefill side) -------------------------------------
    async def start(self) -> None:
        cfg = self.cfg
        if cfg.bootstrap_port is None and cfg.role != "prefill":
            return
        app = web.Application()
        app.router.add_get("/sim/kv/{request_id}", self._get_kv)
        app.router.add_get("/sim/bootstrap/{room}", self._get_room)
        app.router.add_get("/sim/moriio/{transfer_id}", self._get_moriio)
        app.router.add_get("/sim/mooncake/{transfer_id}", self._get_moriio)
        app.router.add_get("/query", self._query)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, cfg.host, cfg.bootstrap_port or 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _query(self, request: web.Request) -> web.Response:
        """vLLM's ``MooncakeBootstrapServer.query``: the engine registered per DP rank."""
        cfg = self.cfg
        entry = {"engine_id": cfg.kv_engine_id, "worker_addr": {"0": {"0": f"tcp://{cfg.advertise_host}:0"}}}
        return web.json_response({str(cfg.dp_rank or 0): entry})

    async def _get_kv(self, request: web.Request) -> web.Response:
        entry = self.transfers.pop(request.match_info["request_id"], None)
        if entry is None:
            return web.json_response({"error": "unknown or already transferred request id"}, status=404)
        return web.json_response(entry)

    async def _handover(
        self,
        request: web.Request,
        prefilled: asyncio.Future[list[int]],
        what: str,
        pending: OrderedDict[Any, asyncio.Future[list[int]]],
        key: Any,
    ) -> web.Response:
        """The prompt's token ids once the prefill of ``what`` finished (waiting up to the
        request's ``timeout``, default ``--pd-timeout-s``; 404 after it), then forgotten
        (``key`` out of ``pending``)."""
        timeout = float(request.query.get("timeout", self.cfg.pd_timeout_s))
        try:
            tokens = await asyncio.wait_for(asyncio.shield(prefilled), timeout)
        except TimeoutError:
            return web.json_response({"error": f"no prefill finished for {what}"}, status=404)
        pending.pop(key, None)
        return web.json_response({"token_ids": tokens, "engine_id": self.cfg.engine_id})

    async def _get_room(self, request: web.Request) -> web.Response:
        try:
            room = int(request.match_info["room"])
        except ValueError:
            return web.json_response({"error": "room must be an integer"}, status=400)
        return await self._handover(request, self._room(room), f"room {room}", self.rooms, room)

    async def _get_moriio(self, request: web.Request) -> web.Response:
        transfer_id = request.match_info["transfer_id"]
        prefilled = self._transfer(transfer_id)
        return await self._handover(request, prefilled, f"transfer {transfer_id}", self.moriio, transfer_id)

    def _transfer(self, transfer_id: str) -> asyncio.Future[list[int]]:
        fut = self.moriio.get(transfer_id)
        if fut is None:
            fut = self.moriio[transfer_id] = asyncio.get_running_loop().create_future()
            while len(self.moriio) > _KEEP:
                self.moriio.popitem(last=False)
        return fut

    def _room(self, room: int) -> asyncio.Future[list[int]]:
        fut = self.rooms.get(room)
        if fut is None:
            fut = self.rooms[room] = asyncio.get_running_loop().create_future()
            while len(self.rooms) > _KEEP:
                self.rooms.popitem(last=False)
        return fut

    # -- request legs ---------------------------------------------------------------------
    async def prepare(self, body: dict[str, Any], reqs: list[SimRequest]) -> None:
        """Before scheduling: mark prefill legs; pull the KV of decode legs."""
        params = body.get("kv_transfer_params")
        if params is not None:
            if not isinstance(params, dict):
                raise ApiError("kv_transfer_params must be an object", "kv_transfer_params")
            if params.get("do_remote_decode"):
                for r in reqs:
                    r.pd = {"remote_decode": True}
                    if params.get("transfer_id") is not None:  # MoRIIO
                        r.pd["transfer_id"] = str(params["transfer_id"])
                    r.max_tokens = 1
            elif params.get("do_remote_prefill") and params.get("remote_bootstrap_addr") is not None:
                await self._pull_mooncake(params, reqs)
            elif params.get("do_remote_prefill") and params.get("transfer_id") is not None:
                await self._pull_moriio(params, reqs)
            elif params.get("do_remote_prefill"):
                await self._pull_nixl(params, reqs)
            return
        if "bootstrap_room" in body and self.cfg.role != "mixed":
            room = body.get("bootstrap_room")
            if isinstance(room, list):
                room = room[0] if room else None
            if not isinstance(room, int) or isinstance(room, bool):
                raise ApiError("bootstrap_room must be an integer", "bootstrap_room")
            if self.cfg.role == "prefill":
                for r in reqs:  # the prefill computes the KV and the first token only
                    r.pd = {"room": room}
                    r.max_tokens = 1
            else:
                await self._pull_bootstrap(body, room, reqs)

    def finish(self, reqs: list[SimRequest]) -> dict[str, Any] | None:
        """After the engine finished: keep the prefill's KV; the response's ``kv_transfer_params``."""
        r = reqs[0]
        if not r.pd:
            return None
        if "room" in r.pd:
            fut = self._room(int(r.pd["room"]))
            if not fut.done():
                fut.set_result(r.prompt)
            return None
        if r.pd.get("transfer_id") is not None:
            transfer_id = str(r.pd["transfer_id"])
            fut = self._transfer(transfer_id)
            if not fut.done():
                fut.set_result(r.prompt)
            if self.cfg.pd_protocol == "vllm-mooncake":
                return None  # MooncakeConnectorScheduler.request_finished returns no params
            return {  # what vLLM's MoRIIOConnectorScheduler.request_finished returns
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": r.pd.get("block_ids", []),
                "remote_engine_id": self.cfg.engine_id,
                "remote_host": self.cfg.advertise_host,
                "remote_handshake_port": self.port,
                "remote_notify_port": self.port,
                "remote_dp_size": 1,
                "tp_size": 1,
                "transfer_id": transfer_id,
            }
        if r.pd.get("remote_decode"):
            self.transfers[r.request_id] = {
                "token_ids": r.prompt,
                "block_ids": [b for b in r.pd.get("block_ids", [])],
                "engine_id": self.cfg.kv_engine_id,
            }
            while len(self.transfers) > _KEEP:
                self.transfers.popitem(last=False)
            return {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": self.cfg.kv_engine_id,
                "remote_block_ids": r.pd.get("block_ids", []),
                "remote_host": self.cfg.advertise_host,
                "remote_port": self.port,
                "remote_request_id": r.request_id,
                "tp_size": 1,
            }
        return None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.cfg.pd_timeout_s + 5)
            )
        return self._session

    async def _pull_nixl(self, params: dict[str, Any], reqs: list[SimRequest]) -> None:
        missing = [
            k for k in ("remote_host", "remote_port", "remote_request_id") if params.get(k) in (None, "")
        ]
        if missing:
            raise ApiError(f"kv_transfer_params lacks {', '.join(missing)}", "kv_transfer_params")
        url = f"http://{params['remote_host']}:{params['remote_port']}/sim/kv/{params['remote_request_id']}"
        entry = await self._fetch(url)
        if entry is None:
            return
        engine_id = params.get("remote_engine_id")
        if engine_id is not None and engine_id != entry.get("engine_id"):
            raise ApiError(
                f"kv_transfer_params.remote_engine_id {engine_id!r} does not match the prefill engine "
                f"{entry.get('engine_id')!r}",
                "kv_transfer_params",
            )
        if params.get("remote_block_ids") is not None and params["remote_block_ids"] != entry.get(
            "block_ids"
        ):
            raise ApiError(
                "kv_transfer_params.remote_block_ids do not match the prefill's blocks", "kv_transfer_params"
            )
        await self._receive(entry.get("token_ids") or [], reqs)

    async def _pull_moriio(self, params: dict[str, Any], reqs: list[SimRequest]) -> None:
        missing = [k for k in ("remote_host", "remote_notify_port") if params.get(k) in (None, "")]
        if missing:
            raise ApiError(f"kv_transfer_params lacks {', '.join(missing)}", "kv_transfer_params")
        host, port, transfer_id = params["remote_host"], params["remote_notify_port"], params["transfer_id"]
        url = f"http://{host}:{port}/sim/moriio/{transfer_id}?timeout={self.cfg.pd_timeout_s}"
        entry = await self._fetch(url)
        if entry is None:
            raise ApiError(
                f"no KV arrived from the prefill for transfer {transfer_id}", "kv_transfer_params", 500
            )
        await self._receive(entry.get("token_ids") or [], reqs)

    async def _pull_mooncake(self, params: dict[str, Any], reqs: list[SimRequest]) -> None:
        """vLLM's MooncakeConnectorWorker: find the engine at the bootstrap server, then receive."""
        missing = [k for k in ("remote_engine_id", "transfer_id") if params.get(k) in (None, "")]
        if missing:
            raise ApiError(f"kv_transfer_params lacks {', '.join(missing)}", "kv_transfer_params")
        addr, engine_id = str(params["remote_bootstrap_addr"]), str(params["remote_engine_id"])
        engines = await self._fetch(addr + "/query") or {}
        if engine_id not in {e.get("engine_id") for e in engines.values() if isinstance(e, dict)}:
            # vLLM fails the request (kv_load_failure_policy "fail", its default)
            raise ApiError(
                f"remote engine_id {engine_id} not found from bootstrap server {addr}",
                "kv_transfer_params",
                500,
            )
        entry = await self._fetch(
            f"{addr}/sim/mooncake/{params['transfer_id']}?timeout={self.cfg.pd_timeout_s}"
        )
        if entry is None:
            raise ApiError(
                f"no KV arrived from the prefill for transfer {params['transfer_id']}",
                "kv_transfer_params",
                500,
            )
        await self._receive(entry.get("token_ids") or [], reqs)

    async def _pull_bootstrap(self, body: dict[str, Any], room: int, reqs: list[SimRequest]) -> None:
        host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
        if not host or not port:
            raise ApiError(
                "bootstrap_host and bootstrap_port are required with bootstrap_room", "bootstrap_host"
            )
        host = str(host)
        url = f"http://{host}:{port}/sim/bootstrap/{room}?timeout={self.cfg.pd_timeout_s}"
        entry = await self._fetch(url)
        if entry is None:
            raise ApiError(f"no KV arrived from the prefill for bootstrap room {room}", "bootstrap_room", 500)
        await self._receive(entry.get("token_ids") or [], reqs)

    async def _fetch(self, url: str) -> dict[str, Any] | None:
        try:
            async with self._client().get(url) as resp:
                if resp.status != 200:
                    log.warning("pd: %s answered %s; recomputing the prompt locally", url, resp.status)
                    return None
                data: dict[str, Any] = await resp.json()
                return data
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("pd: cannot reach %s (%s); recomputing the prompt locally", url, exc)
            return None

    async def _receive(self, tokens: list[int], reqs: list[SimRequest]) -> None:
        """Wait the transfer time, then let the engine treat the common prefix as computed."""
        for r in reqs:
            common = 0
            for a, b in zip(tokens, r.prompt, strict=False):
                if a != b:
                    break
                common += 1
            if common:
                cfg = self.cfg
                seconds = common * cfg.kv_bytes_per_token * 8 / (cfg.transfer_gbps * 1e9)
                if cfg.sleeps:
                    await asyncio.sleep(seconds / cfg.speedup)
                r.pd = {"received": common}
