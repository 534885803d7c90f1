"""The router side of model cards: fetch once per digest, verify, cache on disk, report.

A worker record's ``model_card`` names a card by digest (:mod:`infera_core.tokenize.card`).
The first digest seen for a model is the one the router uses: it is fetched from the
discovery backend that carries it (:class:`~infera_core.discovery.base.CardStore`) once,
refused when larger than ``--card-max-bytes`` or when its bytes do not hash to the digest,
retried while it is still being written up to ``--card-fetch-timeout-s``, and kept under
``--card-cache-dir`` (``<dir>/<hex digest>/``: ``card.json`` and the tokenizer files), so a
restarted router reads it from disk. Workers of the same model that publish another digest
are reported (:meth:`ModelCards.mismatch`; the agreement check flags them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from infera_core.discovery.base import CardStore
from infera_core.tokenize.card import CardError, ModelCard, digest_of
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.tokenize.cards")

RETRY_AFTER_S = 30.0
"""A card that failed to load is tried again on the next record of its model after this long."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "infera" / "cards"


class CardState:
    __slots__ = ("digest", "error", "failed_at", "files", "task")

    def __init__(self, digest: str) -> None:
        self.digest = digest
        self.files: Path | None = None
        self.error: str | None = None
        self.failed_at = 0.0
        self.task: asyncio.Task[None] | None = None

    @property
    def status(self) -> str:
        if self.files is not None:
            return "loaded"
        return f"failed: {self.error}" if self.error else "fetching"


class ModelCards:
    """Per model: the card in use, its state, and which workers publish which digest."""

    def __init__(
        self,
        store: CardStore | None = None,
        cache_dir: str | Path | None = None,
        max_bytes: int = 64 << 20,
        timeout_s: float = 30.0,
        on_loaded: Callable[[str, Path], None] | None = None,
    ) -> None:
        self.store = store
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.on_loaded = on_loaded
        self.models: dict[str, CardState] = {}
        self.digests: dict[str, dict[str, str]] = {}
        """model → {worker_id: digest} of the workers that publish a card."""
        self.fetches = 0
        """Cards fetched from the store (not from the disk cache)."""

    def digest(self, model: str) -> str | None:
        state = self.models.get(model)
        return state.digest if state is not None else None

    def mismatch(self, record: WorkerRecord) -> str | None:
        """Why ``record``'s card disagrees with its model's card in use (None: it agrees)."""
        ref = record.model_card
        want = self.digest(record.model)
        if ref is None or want is None or ref.digest == want:
            return None
        return f"model_card {ref.digest[:19]}… != router's {want[:19]}… for model {record.model!r}"

    def observe(self, record: WorkerRecord) -> None:
        """Note ``record``'s card; start loading it when its model has none yet."""
        ref = record.model_card
        if ref is None:
            return
        seen = self.digests.setdefault(record.model, {})
        seen[record.worker_id] = ref.digest
        state = self.models.get(record.model)
        if state is not None and state.digest != ref.digest:
            if len(set(seen.values())) > 1:
                log.warning(
                    "model %s: workers publish different model cards (%s); the router uses %s,"
                    " worker %s is not credited for its cache",
                    record.model,
                    ", ".join(sorted({d[:19] for d in seen.values()})),
                    state.digest[:19],
                    record.worker_id,
                )
            return
        if state is None:
            state = self.models[record.model] = CardState(ref.digest)
        elif (
            state.files is not None
            or state.task is not None
            or (state.error and time.monotonic() - state.failed_at < RETRY_AFTER_S)
        ):
            return
        if ref.size > self.max_bytes:
            self._fail(record.model, state, f"{ref.size} bytes, over --card-max-bytes {self.max_bytes}")
            return
        state.error = None
        state.task = asyncio.get_running_loop().create_task(
            self._load(record.model, state), name=f"model-card-{record.model}"
        )

    def forget(self, worker_id: str) -> None:
        for seen in self.digests.values():
            seen.pop(worker_id, None)

    async def close(self) -> None:
        for state in self.models.values():
            if state.task is not None:
                state.task.cancel()

    async def _load(self, model: str, state: CardState) -> None:
        try:
            files = await asyncio.wait_for(self._files(state.digest), self.timeout_s)
        except TimeoutError:
            self._fail(model, state, f"not available within --card-fetch-timeout-s {self.timeout_s:g}")
        except (CardError, ValueError, OSError) as exc:
            self._fail(model, state, str(exc))
        except Exception as exc:  # a backend's own error type
            self._fail(model, state, f"{type(exc).__name__}: {exc}")
        else:
            state.files = files
            log.info("model %s: routing tokenizer from model card %s", model, state.digest[:19])
            if self.on_loaded is not None:
                self.on_loaded(model, files)
        finally:
            state.task = None

    def _fail(self, model: str, state: CardState, why: str) -> None:
        state.error, state.failed_at = why, time.monotonic()
        log.error("model %s: model card %s refused: %s", model, state.digest[:19], why)

    async def _files(self, digest: str) -> Path:
        where = self.cache_dir / digest.split(":", 1)[-1]
        cached = where / "card.json"
        if cached.is_file():
            data = await asyncio.to_thread(cached.read_bytes)
            if digest_of(data) == digest:
                return where / "files"
            log.warning("model card cache %s does not match its digest; fetching it again", where)
        data = await self._fetch(digest)
        card = ModelCard.from_bytes(data, digest)
        if not card.has_tokenizer:
            raise CardError(f"model card {digest[:19]} has no tokenizer.json")
        await asyncio.to_thread(self._write, where, card, data)
        return where / "files"

    async def _fetch(self, digest: str) -> bytes:
        if self.store is None:
            raise CardError("the discovery backend keeps no model cards")
        delay = 0.05
        while True:
            data = await self.store.get_card(digest, self.max_bytes)
            if data is not None:
                if len(data) > self.max_bytes:
                    raise CardError(f"{len(data)} bytes, over --card-max-bytes {self.max_bytes}")
                self.fetches += 1
                return data
            await asyncio.sleep(delay)  # not stored yet (the worker stores it after registering)
            delay = min(delay * 2, 1.0)

    @staticmethod
    def _write(where: Path, card: ModelCard, data: bytes) -> None:
        """Write the card's folder atomically. Router processes sharing the cache dir may
        write the same card at once: a valid folder is never removed (another process may be
        reading it), an invalid one is moved aside first."""
        cached = where / "card.json"
        if cached.is_file() and cached.read_bytes() == data:
            return
        where.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=where.parent))
        try:
            card.write_files(tmp / "files")
            (tmp / "card.json").write_bytes(data)
            if where.exists():
                aside = Path(tempfile.mkdtemp(prefix=".old-", dir=where.parent))
                with contextlib.suppress(OSError):
                    where.rename(aside / "card")
                shutil.rmtree(aside, ignore_errors=True)
            try:
                tmp.rename(where)
            except OSError:
                if not (cached.is_file() and cached.read_bytes() == data):  # else another process wrote it
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
