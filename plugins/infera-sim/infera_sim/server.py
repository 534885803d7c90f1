"""The sim engine's HTTP server: ``python -m infera_sim.server --port P --model NAME [flags]``.

On start it prints one line ``INFERA_SIM_READY {json}`` with the ports it bound
(HTTP, KV events, replay, PD transfer), which also ``GET /sim/info`` returns.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
import zmq
from aiohttp import web

from infera_sim import __version__
from infera_sim.config import SimConfig, parse_args
from infera_sim.engine import SimEngine
from infera_sim.kv_publisher import KvPublisher
from infera_sim.openai_api import ApiError, chat_body, completion_body, error_body, parse, prompt_logprobs
from infera_sim.pd import PdManager
from infera_sim.pooling import Handler as PoolHandler
from infera_sim.pooling import Pooling, openapi
from infera_sim.request import SimRequest
from infera_sim.responses import SimResponses
from infera_sim.sse import stream
from infera_sim.tokenizer import make_tokenizer

log = logging.getLogger("infera_sim")
DP_RANK_HEADER = "X-Data-Parallel-Rank"
_json = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
SIM_KEY: web.AppKey[SimServer] = web.AppKey("sim", object)  # type: ignore[arg-type]


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=_json(obj), status=status, content_type="application/json")


def api_error(err: ApiError) -> web.Response:
    return json_response(err.body(), err.status)


class SimServer:
    """Holds the engine, the KV publisher and the PD manager of one sim process."""

    def __init__(self, cfg: SimConfig) -> None:
        if not cfg.engine_id:
            cfg.engine_id = uuid.uuid4().hex
        self.cfg = cfg
        self.tokenizer = make_tokenizer(cfg.tokenizer_json, cfg.vocab_size)
        self.publisher: KvPublisher | None = None
        self.engines = [SimEngine(cfg, self.tokenizer) for _ in range(max(1, cfg.dp_size))]
        """One engine per DP-attention rank (``--dp-size``; one without it)."""
        self.engine = self.engines[0]
        for engine in self.engines[1:]:  # one /metrics for the server: the ranks' counters add up
            engine.metrics = self.engine.metrics
        self.publishers: list[KvPublisher] = []
        self.dp_requests = [0] * len(self.engines)
        """Requests each rank served (``/sim/info``: where the router steered them)."""
        self._next_rank = 0
        self.pd = PdManager(cfg)
        self.pooling = Pooling(cfg.task, cfg.model, self.tokenizer, cfg.max_model_len, cfg.seed)
        self.started = time.monotonic()
        self.requests_seen = 0
        self.http_port = cfg.port
        self._rng = random.Random(cfg.seed ^ 0x5EED)
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self, app: web.Application) -> None:
        cfg = self.cfg
        if cfg.kv_events_port is not None:
            self.publishers = bind_publishers(cfg)
            self.publisher = self.publishers[0]
            for engine, publisher in zip(self.engines, self.publishers, strict=True):
                publisher.start()
                engine.publish = publisher.publish
        await self.pd.start()
        for engine in self.engines:
            task = asyncio.get_running_loop().create_task(engine.run())
            task.add_done_callback(self._engine_stopped)
            self._tasks.append(task)

    def _engine_stopped(self, task: asyncio.Task[None]) -> None:
        """Like a dead vLLM engine core: a failed step loop takes the process down."""
        if not task.cancelled() and task.exception() is not None:
            log.error("engine step loop died", exc_info=task.exception())
            os._exit(70)

    async def stop(self, app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        await self.pd.close()
        for publisher in self.publishers:
            publisher.flush_held()
            publisher.close()

    def info(self) -> dict[str, Any]:
        p = self.publisher
        return {
            "port": self.http_port,
            "model": self.cfg.model,
            "kv_events_port": p.port if p else None,
            "kv_replay_port": p.replay_port if p else None,
            "bootstrap_port": self.pd.port,
            "engine_id": self.cfg.engine_id,
            "kv_engine_id": self.cfg.kv_engine_id,
            "role": self.cfg.role,
            "block_size": self.cfg.block_size,
            "fingerprint": self.tokenizer.fingerprint,
            "pid": os.getpid(),
            "dp_size": len(self.engines),
            "dp_requests": list(self.dp_requests),
        }

    def rank_engine(self, request: web.Request) -> SimEngine:
        """The engine of the rank ``X-Data-Parallel-Rank`` names (as SGLang reads it), else the next in turn."""
        n = len(self.engines)
        header = request.headers.get(DP_RANK_HEADER)
        if header is None:
            rank = self._next_rank % n
            self._next_rank += 1
        else:
            try:
                rank = int(header)
            except ValueError:
                raise ApiError(
                    f"Invalid {DP_RANK_HEADER} header: must be an integer, got {header!r}"
                ) from None
            if not 0 <= rank < n:
                raise ApiError(f"{DP_RANK_HEADER} {rank} is outside this server's {n} DP ranks")
        self.dp_requests[rank] += 1
        return self.engines[rank]

    # -- handlers ------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = _decode(await request.read())
        except msgspec.DecodeError as exc:
            raise ApiError(f"Invalid JSON body: {exc}", None) from None
        if not isinstance(body, dict):
            raise ApiError("The request body must be a JSON object", None)
        return body

    async def _faults(self) -> web.Response | None:
        cfg = self.cfg
        self.requests_seen += 1
        if cfg.fault_crash_after and self.requests_seen > cfg.fault_crash_after:
            log.error("fault injection: crashing after %d requests", cfg.fault_crash_after)
            os._exit(17)
        if cfg.fault_hang:
            self.engine.held += 1
            try:
                await asyncio.Event().wait()
            finally:
                self.engine.held -= 1
        if cfg.fault_error_rate and self._rng.random() < cfg.fault_error_rate:
            status = cfg.fault_error_status
            kind = {429: "RateLimitError", 503: "ServiceUnavailableError"}.get(status, "InternalServerError")
            return json_response(error_body("injected fault", kind, None, status), status)
        return None

    def _prompt_logprobs(self, out: dict[str, Any], reqs: list[SimRequest], chat: bool) -> None:
        """Fill ``prompt_logprobs`` where vLLM puts them: after ``usage`` in a chat answer,
        in each choice of a completion."""
        decode = self.tokenizer.decode_token
        if chat:
            out["prompt_logprobs"] = prompt_logprobs(reqs[0].prompt, decode)
            return
        n = len(reqs[0].choices)
        for i, choice in enumerate(out["choices"]):
            choice["prompt_logprobs"] = prompt_logprobs(reqs[i // n].prompt, decode)

    async def generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        fault = await self._faults()
        if fault is not None:
            return fault
        try:
            engine = self.rank_engine(request)
            body = await self._body(request)
            parsed = parse(body, self.tokenizer, self.cfg, chat)
            need = max(engine.blocks_needed(len(p), parsed.max_tokens) for p in parsed.prompts)
            if need > self.cfg.cache_blocks:
                raise ApiError(
                    f"The request needs {need} KV cache blocks but the cache holds {self.cfg.cache_blocks} "
                    "(--cache-blocks); reduce the prompt or max_tokens.",
                    "max_tokens",
                )
            rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
            reqs = parsed.make_requests(rid)
            engine.held += 1
            try:
                await self.pd.prepare(body, reqs)
            finally:
                engine.held -= 1
        except ApiError as err:
            return api_error(err)
        wake = asyncio.Event()
        for r in reqs:
            r.wake = wake
            r.stream = parsed.stream
            engine.add(r)
        created = int(time.time())
        rid_out = ("chatcmpl-" if chat else "cmpl-") + rid
        model = parsed.lora[0] if parsed.lora is not None else self.cfg.model  # vLLM echoes the adapter
        try:
            if parsed.stream:
                resp = await stream(request, reqs, parsed, rid_out, created, model, chat, wake)
                if all(r.done for r in reqs):
                    self.pd.finish(reqs)  # a streamed prefill leg (SGLang bootstrap) still hands its KV over
                return resp
            while not all(r.done for r in reqs):
                await wake.wait()
                wake.clear()
            if chat:
                out = chat_body(rid_out, created, model, reqs[0], parsed.tool_call)
            else:
                out = completion_body(rid_out, created, model, reqs)
            if parsed.prompt_logprobs is not None:
                self._prompt_logprobs(out, reqs, chat)
            out["kv_transfer_params"] = self.pd.finish(reqs)
            return json_response(out)
        finally:
            for r in reqs:
                if not r.done:
                    engine.abort(r)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self.generate(request, chat=True)

    def pooled(self, handler: PoolHandler) -> Callable[[web.Request], Awaitable[web.Response]]:
        """An aiohttp handler around a pooling handler (faults, JSON body, errors)."""

        async def handle(request: web.Request) -> web.Response:
            fault = await self._faults()
            if fault is not None:
                return fault
            try:
                return json_response(await handler(await self._body(request)))
            except ApiError as err:
                return api_error(err)

        return handle

    async def health(self, request: web.Request) -> web.Response:
        if time.monotonic() - self.started < self.cfg.fault_slow_start:
            return web.Response(status=503, text="starting")
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        m = self.cfg.model
        card = {
            "id": m,
            "object": "model",
            "created": int(self.started),
            "owned_by": "infera-sim",
            "root": m,
            "parent": None,
            "max_model_len": self.cfg.max_model_len,
            "permission": [],
        }
        # each LoRA adapter as vLLM lists it: its path as root, the served model as parent
        lora = [
            {**card, "id": name, "root": path, "parent": m, "max_model_len": None}
            for name, path in self.cfg.lora_modules.items()
        ]
        return json_response({"object": "list", "data": [card, *lora]})

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            if isinstance(body.get("messages"), list):
                tokens = self.tokenizer.encode_chat(body["messages"], body)
            elif isinstance(body.get("prompt"), str):
                tokens = self.tokenizer.encode(body["prompt"])
                if body.get("add_special_tokens") is False and tokens[:1] == [1]:
                    tokens = tokens[1:]
            else:
                raise ApiError("prompt (a string) or messages is required", "prompt")
        except ApiError as err:
            return api_error(err)
        return json_response(
            {
                "count": len(tokens),
                "max_model_len": self.cfg.max_model_len,
                "tokens": tokens,
                "token_strs": None,
            }
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``/detokenize``: ``{"model", "tokens"}`` → ``{"prompt"}``."""
        try:
            body = await self._body(request)
            tokens = body.get("tokens")
            if not isinstance(tokens, list) or not all(type(t) is int and 0 <= t < 2**63 for t in tokens):
                raise ApiError("tokens (a list of non-negative integers) is required", "tokens")
        except ApiError as err:
            return api_error(err)
        return json_response({"prompt": self.tokenizer.decode(tokens)})

    async def version(self, request: web.Request) -> web.Response:
        return json_response({"version": f"infera-sim-{__version__}"})

    async def metrics(self, request: web.Request) -> web.Response:
        if len(self.engines) == 1:
            text = self.engine.render_metrics()
        else:
            engines = self.engines
            usage = sum(e.cache.usage for e in engines) / len(engines)
            running, waiting = sum(e.num_running for e in engines), sum(e.num_waiting for e in engines)
            text = self.engine.metrics.render(running, waiting, usage)
        return web.Response(text=text, content_type="text/plain")

    async def load_lora(self, request: web.Request) -> web.Response:
        """vLLM's ``/v1/load_lora_adapter`` (``lora_name``, ``lora_path``; the path is not read)."""
        try:
            body = await self._body(request)
            name, path = body.get("lora_name"), body.get("lora_path")
            if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
                raise ApiError("Both 'lora_name' and 'lora_path' must be provided.", "lora_name")
            if name in self.cfg.lora_modules or name == self.cfg.model:
                raise ApiError(f"The lora adapter '{name}' has already been loaded.", "lora_name")
        except ApiError as err:
            return api_error(err)
        self.cfg.lora_modules[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(self, request: web.Request) -> web.Response:
        """vLLM's ``/v1/unload_lora_adapter`` (``lora_name``)."""
        try:
            name = (await self._body(request)).get("lora_name")
            if not isinstance(name, str) or name not in self.cfg.lora_modules:
                raise ApiError(f"The lora adapter '{name}' cannot be found.", "lora_name", 404)
        except ApiError as err:
            return api_error(err)
        del self.cfg.lora_modules[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        ok = all([e.reset_prefix_cache() for e in self.engines])
        if not ok:
            err = error_body(
                "Requests are running; the prefix cache was not reset.", "ConflictError", None, 409
            )
            return json_response(err, 409)
        return web.Response(status=200)

    async def sim_info(self, request: web.Request) -> web.Response:
        return json_response(self.info())

    async def sim_cache(self, request: web.Request) -> web.Response:
        """Hashes of every cached block, and the publisher's next sequence number (tests)."""
        text = request.query.get("rank", "0")
        rank = int(text) if text.isdigit() else -1
        if not 0 <= rank < len(self.engines):
            return json_response(error_body(f"no DP rank {rank}", "NotFoundError", "rank", 404), 404)
        seq = self.publishers[rank].seq if self.publishers else None
        cache = self.engines[rank].cache
        return json_response(
            {"block_hashes": sorted(cache.contents()), "next_seq": seq, "used_blocks": cache.used}
        )


def bind_publishers(cfg: SimConfig) -> list[KvPublisher]:
    """One KV publisher per DP rank on consecutive ports (SGLang's layout: rank r on port + r,
    replay port + r, ``dp_rank`` r in every batch); port 0 picks a free consecutive range."""
    assert cfg.kv_events_port is not None
    host = "*" if cfg.host in ("0.0.0.0", "") else cfg.host
    n = max(1, cfg.dp_size)
    single = cfg.dp_rank if cfg.dp_rank is not None else 0
    for _ in range(50 if n > 1 and (cfg.kv_events_port == 0 or cfg.kv_replay_port == 0) else 1):
        publishers: list[KvPublisher] = []
        try:
            for r in range(n):
                first = publishers[0] if publishers else None
                port = cfg.kv_events_port if first is None else first.port + r
                replay = cfg.kv_replay_port
                if first is not None and first.replay_port is not None:
                    replay = first.replay_port + r
                publishers.append(
                    KvPublisher(
                        host,
                        port,
                        replay,
                        topic=cfg.kv_events_topic,
                        layout=cfg.kv_events_layout,
                        dp_rank=r if n > 1 else single,
                        buffer=cfg.kv_replay_buffer,
                        drop_rate=cfg.fault_kv_drop_rate,
                        duplicate_rate=cfg.fault_kv_duplicate_rate,
                        reorder=cfg.fault_kv_reorder,
                        seed=cfg.seed + r,
                    )
                )
            return publishers
        except zmq.ZMQError as exc:
            for p in publishers:
                p.close()
            last = exc
    raise OSError(f"KV event ports for {n} DP rank(s) not bindable: {last}")


def create_app(cfg: SimConfig) -> web.Application:
    """The aiohttp application of one sim engine."""
    sim = SimServer(cfg)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[SIM_KEY] = sim
    app.on_startup.append(sim.start)
    app.on_cleanup.append(sim.stop)
    r = app.router
    if cfg.task == "generate":
        r.add_post("/v1/completions", sim.completions)
        r.add_post("/v1/chat/completions", sim.chat)
    else:  # a pooling model: vLLM mounts no generate route for it
        for path, handler in sim.pooling.routes().items():
            r.add_post(path, sim.pooled(handler))
    r.add_get("/openapi.json", openapi)
    r.add_get("/v1/models", sim.models)
    r.add_get("/health", sim.health)
    r.add_post("/tokenize", sim.tokenize)
    r.add_post("/detokenize", sim.detokenize)
    r.add_get("/version", sim.version)
    r.add_get("/metrics", sim.metrics)
    r.add_post("/reset_prefix_cache", sim.reset_prefix_cache)
    SimResponses(cfg, sim.tokenizer, sim.rank_engine).add_routes(r)
    if os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"):  # as vLLM
        r.add_post("/v1/load_lora_adapter", sim.load_lora)
        r.add_post("/v1/unload_lora_adapter", sim.unload_lora)
    r.add_get("/sim/info", sim.sim_info)
    r.add_get("/sim/cache", sim.sim_cache)
    return app


async def serve(cfg: SimConfig) -> None:
    app = create_app(cfg)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, backlog=4096)
    await site.start()
    sim = app[SIM_KEY]
    sim.http_port = int(runner.addresses[0][1])
    print("INFERA_SIM_READY " + json.dumps(sim.info()), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_args(argv)
    refusal = cfg.refusal()
    if refusal is not None:  # like vLLM, the engine dies at start
        print(refusal, file=sys.stderr)
        raise SystemExit(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    from infera_core.errors import InferaError

    try:
        runner(serve(cfg))
    except InferaError as exc:
        print(f"infera-sim: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as exc:
        print(
            f"infera-sim: cannot bind (--port/--kv-events-port/--kv-replay-port/--bootstrap-port): {exc}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
