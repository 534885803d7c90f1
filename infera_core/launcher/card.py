"""The launcher's model card: built from the model it started, published with its record.

Which files: the engine's ``--tokenizer`` directory when the engine arguments name one,
else the model (``--model-path``, or the model name): a local directory, or a hub id
resolved in the local Hugging Face cache (``HF_HUB_CACHE``, ``HF_HOME/hub`` or
``~/.cache/huggingface/hub``; ``--revision`` or the cached ``main``). Nothing is downloaded.
The engine's ``/v1/models`` adds the served names, the max model length and the LoRA
adapters; the record adds the served KV block size; ``--prefix-caching-hash-algo`` and
``PYTHONHASHSEED`` the hash settings.

A model with no local tokenizer files gets no card: when the engine answers ``/tokenize``,
the record is labelled ``infera.tokenizer=engine`` and routers ask the engine for token ids
(:mod:`infera_core.tokenize.engine`); else routers need ``--tokenizer``. A discovery backend that keeps no
cards (:class:`~infera_core.discovery.base.CardStore`) publishes none.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import httpx

from infera_core.discovery.base import CardStore, Discovery
from infera_core.engines.base import LaunchContext
from infera_core.tokenize.card import ModelCard, card_files, digest_of
from infera_core.worker import ModelCardRef, WorkerRecord

log = logging.getLogger("infera.launcher")

TOKENIZER_LABEL = "infera.tokenizer"
"""The record label that names a routing tokenizer (:mod:`infera_core.tokenize.service`)."""


def _flag(args: list[str], *names: str) -> str | None:
    """The value of the last ``--name VALUE`` / ``--name=VALUE`` in ``args``."""
    found = None
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                found = args[i + 1]
            elif a.startswith(n + "="):
                found = a.split("=", 1)[1]
    return found


def hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def model_dir(name: str, revision: str | None = None) -> Path | None:
    """A local model directory, or a hub id's cached snapshot; None when neither exists."""
    p = Path(name).expanduser()
    if p.is_dir():
        return p
    if name.count("/") != 1 or name.startswith(("/", ".")):
        return None
    repo = hub_cache() / ("models--" + name.replace("/", "--"))
    rev = revision or "main"
    ref = repo / "refs" / rev
    if ref.is_file():
        rev = ref.read_text().strip()
    snap = repo / "snapshots" / rev
    return snap if snap.is_dir() else None


async def served_models(client: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    try:
        r = await client.get(f"{url}/v1/models")
        data = r.json().get("data") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return []
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []


def lora_adapters(served: list[dict[str, Any]]) -> list[str]:
    """The LoRA adapters among an engine's ``/v1/models`` entries (vLLM lists each
    ``--lora-modules`` name with a ``parent``: its base model)."""
    return sorted({str(m["id"]) for m in served if m.get("id") and m.get("parent")})


async def build_card(
    engine: str,
    ctx: LaunchContext,
    record: WorkerRecord,
    client: httpx.AsyncClient,
    served: list[dict[str, Any]] | None = None,
) -> ModelCard | None:
    """The card of the model ``ctx`` started (see the module docstring); None without files.
    ``served``: the engine's ``/v1/models`` entries when already fetched."""
    args = ctx.engine_args
    tok = _flag(args, "--tokenizer", "--tokenizer-path")
    revision = _flag(args, "--tokenizer-revision") if tok else _flag(args, "--revision")
    where = model_dir(tok or ctx.served_path, revision)
    files = card_files(where) if where is not None else {}
    if "tokenizer.json" not in files:
        log.info(
            "worker %s: no local tokenizer.json for %s: no model card (routers need --tokenizer"
            " or the engine's /tokenize)",
            ctx.worker_id,
            tok or ctx.served_path,
        )
        return None
    if served is None:
        served = await served_models(client, ctx.url)
    names = [str(m["id"]) for m in served if m.get("id") and not m.get("parent")] or [ctx.model]
    lora = lora_adapters(served)
    max_len = next((m.get("max_model_len") for m in served if str(m.get("id")) == ctx.model), None)
    if not isinstance(max_len, int):
        given = _flag(args, "--max-model-len", "--context-length")
        max_len = int(given) if given and given.isdigit() else None
    algo = _flag(args, "--prefix-caching-hash-algo")
    return ModelCard(
        model=ctx.model,
        files=files,
        served_names=names,
        source=str(where),
        engine=engine,
        block_size=record.kv_events.block_size if record.kv_events else None,
        hash={"algo": algo, "python_hash_seed": os.environ.get("PYTHONHASHSEED")},
        max_model_len=max_len,
        lora=lora,
    )


async def with_engine_tokenize(
    ctx: LaunchContext, record: WorkerRecord, client: httpx.AsyncClient
) -> WorkerRecord:
    """``record`` labelled ``infera.tokenizer=engine`` when the engine answers ``/tokenize`` for
    its model (routers then ask it for token ids), unless the record already names a tokenizer
    (a label, or a fingerprint family the router knows)."""
    if TOKENIZER_LABEL in record.labels or (record.kv_events and record.kv_events.fingerprint):
        return record
    try:
        r = await client.post(f"{ctx.url}/tokenize", json={"model": ctx.model, "prompt": "hello"})
        ok = r.status_code == 200 and isinstance(r.json().get("tokens"), list)
    except (httpx.HTTPError, ValueError, AttributeError):
        ok = False
    if not ok:
        return record
    log.info("worker %s: routers will tokenize %s with the engine's /tokenize", ctx.worker_id, ctx.model)
    return record.model_copy(update={"labels": {**record.labels, TOKENIZER_LABEL: "engine"}})


class CardPublisher:
    """Adds the card to the record before registration, stores it after, releases it after
    deregistration."""

    def __init__(self) -> None:
        self.data: bytes | None = None
        self.digest: str | None = None
        self._store: CardStore | None = None

    async def prepare(
        self,
        engine: str,
        ctx: LaunchContext,
        record: WorkerRecord,
        client: httpx.AsyncClient,
        discovery: Discovery,
    ) -> WorkerRecord:
        card = None
        served = await served_models(client, ctx.url)
        adapters = lora_adapters(served)
        if adapters:
            log.info("worker %s: serves LoRA adapters %s", ctx.worker_id, ", ".join(adapters))
            record = record.model_copy(update={"lora_adapters": adapters})
        try:
            card = await build_card(engine, ctx, record, client, served)
        except (OSError, UnicodeDecodeError) as exc:
            log.warning(
                "worker %s: cannot read the model's tokenizer files (%s): no model card", ctx.worker_id, exc
            )
        if card is None:
            return await with_engine_tokenize(ctx, record, client)
        if not isinstance(discovery, CardStore):
            log.info("worker %s: discovery %s keeps no model cards", ctx.worker_id, ctx.discovery)
            return await with_engine_tokenize(ctx, record, client)
        self._store = discovery
        self.data = card.to_bytes()
        self.digest = digest_of(self.data)
        ref = ModelCardRef(digest=self.digest, size=len(self.data), source=discovery.card_source)
        return record.model_copy(update={"model_card": ref})

    async def publish(self, worker_id: str) -> None:
        if self._store is None or self.data is None or self.digest is None:
            return
        try:
            await self._store.put_card(self.digest, self.data)
        except Exception as exc:  # the worker still serves; routers then need --tokenizer
            log.warning(
                "worker %s: could not publish its model card %s: %s", worker_id, self.digest[:19], exc
            )
            return
        log.info("worker %s: model card %s (%d bytes) published", worker_id, self.digest[:19], len(self.data))

    async def release(self) -> None:
        if self._store is not None and self.digest is not None:
            await self._store.release_card(self.digest)
