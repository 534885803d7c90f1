"""docs/reference/engines.md's "by case" tables are what the adapters emit, row by row.

Each table under a heading ``… by case (engine `NAME`)`` has the worker's flags in its first
column (``infera-run worker NAME --model m --model-path /models/m --host 0.0.0.0 --port 8000
--advertise-host 10.0.0.7 --worker-id w1`` plus these) and what the engine gets in the second:

* code spans are argv fragments, each found contiguously in the argv the adapter builds;
* ``env `K=V …``` are entries of the launch environment;
* ``no `--flag …``` are flags absent from the argv, ``no env `K …``` variables absent from the environment;
* ``refused: `text``` is the one error line (it contains ``text``).

Placeholders: ``<port>`` a free port Infera picks, ``<python>`` the engine's interpreter,
``<tmp>`` the temp dir, ``<llama-server>``/``<text-generation-launcher>``/``<trtllm-serve>``/
``<frontend>`` the engine's executable. The worker flags are parsed by the real
``infera-run worker NAME`` command and the launcher's ``launch_options``, the argv built by the
real adapter's ``build_launch`` (engines faked by an interpreter that has their module; no
engine runs), so the docs cannot drift from the code.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import shlex
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infera_core.cli.worker import OPT_PREFIX, _engine_command
from infera_core.config.settings import compose_settings, resolve
from infera_core.engines import support as engine_support
from infera_core.engines.base import LaunchContext, LaunchSpec
from infera_core.engines.settings import WorkerSettings
from infera_core.errors import InferaError
from infera_core.launcher.flags import launch_options
from infera_core.plugin.hooks import InferaHooks
from infera_core.plugin.settings import backend_models
from infera_core.testing.engine_env import make_engine_env

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "engines.md"
HEADING = re.compile(r"^#{2,5} .* by case \(engine `([a-z0-9_-]+)`\)\s*$")
CODE = re.compile(r"`([^`]+)`")
FREE_PORTS = 47500  # free ports come from 47500…47999 (less a DP rank: 47xxx), shown as <port>
PORT = re.compile(r"(?<![\d.])47\d{3}(?!\d)")
BINARIES = {"llama-server", "text-generation-launcher", "trtllm-serve"}
ENGINE_MODULES = {
    "vllm": "vllm.entrypoints.openai.api_server",
    "sglang": "sglang.launch_server",
    "atom": "atom.entrypoints.openai_server",
}
BASE_FLAGS = (
    "--model m --model-path /models/m --host 0.0.0.0 --port 8000 --advertise-host 10.0.0.7 --worker-id w1"
)


@dataclass(frozen=True)
class Row:
    engine: str
    worker: str
    gets: str
    line: int

    @property
    def id(self) -> str:
        return f"{self.engine}: {self.worker or '(defaults)'}"


def _cells(line: str) -> list[str]:
    """A markdown table row's cells (``\\|`` inside a cell is a literal pipe)."""
    parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [p.strip().replace("\\|", "|") for p in parts]


def doc_rows(text: str) -> list[Row]:
    rows: list[Row] = []
    engine: str | None = None
    in_table = False
    for number, line in enumerate(text.splitlines(), 1):
        found = HEADING.match(line)
        if found:
            engine, in_table = found.group(1), False
            continue
        if line.startswith("#"):
            engine = None
            continue
        if engine is None:
            continue
        if not line.startswith("|"):
            if in_table:
                engine = None  # one table per heading
            continue
        in_table = True
        cells = _cells(line)
        if set(cells[0]) <= {"-", ":"} or cells[0].startswith("worker"):
            continue  # separator or header
        worker = CODE.findall(cells[0])
        rows.append(Row(engine, worker[0] if worker else "", cells[1], number))
    return rows


ROWS = doc_rows(DOC.read_text())


@dataclass
class Built:
    argv: list[str]
    env: dict[str, str]


class Fakes:
    """Engine interpreters and executables to launch against, and their placeholders."""

    def __init__(self, root: Path) -> None:
        self.names: dict[str, str] = {}
        self.pythons: dict[str, str] = {}
        for engine, module in ENGINE_MODULES.items():
            self.pythons[engine] = make_engine_env(root / engine, module).python
            self.names[self.pythons[engine]] = "<python>"
        self.pythons["triton"] = make_engine_env(root / "triton", None).python
        self.names[self.pythons["triton"]] = "<python>"
        self.bin = root / "bin"
        self.bin.mkdir()
        for name in BINARIES:
            exe = self.bin / name
            exe.write_text("#!/bin/sh\nexit 0\n")
            exe.chmod(0o755)
            self.names[str(exe)] = f"<{name}>"
        self.frontend = root / "openai_frontend" / "main.py"
        self.frontend.parent.mkdir()
        self.frontend.write_text("")
        self.names[str(self.frontend)] = "<frontend>"
        self.names[tempfile.gettempdir().rstrip("/") + "/"] = "<tmp>/"

    def show(self, text: str) -> str:
        for real, shown in sorted(self.names.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(real, shown)
        return PORT.sub("<port>", text)


def worker_context(hooks: InferaHooks, fakes: Fakes, engine: str, flags: str) -> LaunchContext:
    """The LaunchContext ``infera-run worker ENGINE BASE_FLAGS FLAGS`` hands the adapter."""
    adapter = hooks.require("engine", engine)
    command = _engine_command(hooks, adapter)
    args = [*shlex.split(BASE_FLAGS), *shlex.split(flags)]
    if engine == "triton" and "--triton-frontend" not in args:
        args = ["--triton-frontend", str(fakes.frontend), *args]
    with command.make_context(f"worker {engine}", args) as click_ctx:
        params = dict(click_ctx.params)
    given = {k[len(OPT_PREFIX) :]: v for k, v in params.items() if k.startswith(OPT_PREFIX)}
    infera = {k: v for k, v in params.items() if not k.startswith(OPT_PREFIX)}
    infera.pop("engine_args")
    infera.pop("config_file")
    model = compose_settings(WorkerSettings, backend_models(hooks.catalog()))
    s: Any = resolve(model, infera, None)
    options, engine_args = launch_options(adapter, given, list(params["engine_args"]))
    ports = itertools.count(FREE_PORTS)
    return LaunchContext(
        worker_id=s.worker_id,
        model=s.model,
        model_path=s.model_path,
        role=s.role,
        host=s.host,
        port=s.port,
        advertise_host=s.advertise_host,
        engine_args=engine_args,
        options=options,
        engine_python=fakes.pythons.get(engine),
        free_port=lambda: next(ports),
        discovery="etcd",
        hooks=hooks,
    )


def build(hooks: InferaHooks, fakes: Fakes, engine: str, flags: str) -> Built:
    ctx = worker_context(hooks, fakes, engine, flags)
    adapter = hooks.require("engine", engine)
    spec: LaunchSpec = adapter.build_launch(ctx)
    adapter.record_fields(ctx)  # must agree with the launch (same ports) and not fail
    return Built([fakes.show(a) for a in spec.argv], {k: fakes.show(v) for k, v in spec.env.items()})


def _segments(cell: str) -> list[str]:
    """``cell`` split at ``;`` outside code spans."""
    out, current, in_code = [], "", False
    for ch in cell:
        if ch == "`":
            in_code = not in_code
        if ch == ";" and not in_code:
            out.append(current.strip())
            current = ""
            continue
        current += ch
    return [s for s in [*out, current.strip()] if s]


def _contains(argv: list[str], fragment: list[str]) -> bool:
    n = len(fragment)
    return any(argv[i : i + n] == fragment for i in range(len(argv) - n + 1))


def check_row(row: Row, hooks: InferaHooks, fakes: Fakes) -> list[str]:
    """What disagrees between the row and the adapter ([] when nothing does)."""
    problems: list[str] = []
    segments = _segments(row.gets)
    refused = [s for s in segments if s.startswith("refused")]
    try:
        built = build(hooks, fakes, row.engine, row.worker)
    except InferaError as exc:
        message = fakes.show(str(exc))
        if not refused:
            return [f"the adapter refuses it: {message}"]
        for wanted in CODE.findall(refused[0]):
            if wanted not in message:
                problems.append(f"error line {message!r} lacks {wanted!r}")
        return problems
    if refused:
        return [f"the adapter accepts it: {shlex.join(built.argv)}"]
    for segment in segments:
        spans = CODE.findall(segment)
        if not spans:
            problems.append(f"no code span in {segment!r}")
        elif segment.startswith("env "):
            for item in (i for span in spans for i in shlex.split(span)):
                key, _, value = item.partition("=")
                if built.env.get(key) != value:
                    problems.append(f"env {key}={built.env.get(key)!r}, the table says {value!r}")
        elif segment.startswith("no env "):
            for key in (k for span in spans for k in shlex.split(span)):
                if key in built.env:
                    problems.append(f"env has {key}={built.env[key]!r}")
        elif segment.startswith("no "):
            for flag in (f for span in spans for f in shlex.split(span)):
                if flag in built.argv:
                    problems.append(f"{flag} is in the argv")
        else:
            for span in spans:
                if not _contains(built.argv, shlex.split(span)):
                    problems.append(f"`{span}` is not in the argv")
    if problems:
        problems.append(f"argv: {shlex.join(built.argv)}; env: {built.env}")
    return problems


@pytest.fixture(scope="module")
def hooks() -> InferaHooks:
    return InferaHooks.load()


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fakes]:
    made = Fakes(tmp_path_factory.mktemp("argv-tables"))
    saved = {k: os.environ.get(k) for k in ("PATH", engine_support.ENGINE_PYTHON_ENV)}
    os.environ["PATH"] = f"{made.bin}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ.pop(engine_support.ENGINE_PYTHON_ENV, None)
    for key in [k for k in os.environ if k.startswith("INFERA_")]:
        saved[key] = os.environ.pop(key)
    probe = engine_support.probe_python
    engine_support.probe_python = functools.cache(probe)  # type: ignore[assignment]  # one probe per fake
    try:
        yield made
    finally:
        engine_support.probe_python = probe  # type: ignore[assignment]
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_every_engine_has_a_by_case_table() -> None:
    engines = {row.engine for row in ROWS}
    for name in ("vllm", "sglang", "atom", "llamacpp", "tgi", "trtllm", "triton", "openai"):
        assert name in engines, f"docs/reference/engines.md has no '… by case (engine `{name}`)' table"


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_the_row_is_what_the_adapter_emits(row: Row, hooks: InferaHooks, fakes: Fakes) -> None:
    problems = check_row(row, hooks, fakes)
    assert not problems, f"docs/reference/engines.md line {row.line} ({row.id}): " + "; ".join(problems)


def test_a_wrong_row_is_caught(hooks: InferaHooks, fakes: Fakes) -> None:
    """The check fails a row that names another flag, a missing env entry or a wrong error."""
    wrong = [
        Row("vllm", "--tp 4", "`--tensor-parallel-size 2`", 0),
        Row("vllm", "--role prefill", "env `VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1`", 0),
        Row("vllm", "--tp 4", "no `--tensor-parallel-size`", 0),
        Row("sglang", "--dp-size 2 --tp 3", "`--tp-size 3`", 0),
        Row("sglang", "--tp 2", "refused: `multiple`", 0),
    ]
    for row in wrong:
        assert check_row(row, hooks, fakes), row


def _draft(engine: str, flags: str) -> Any:  # pragma: no cover - a helper for writing the tables
    """``python tests/engines/test_argv_tables.py ENGINE 'FLAGS'`` prints what the row would say."""
    with tempfile.TemporaryDirectory() as tmp:
        fakes = Fakes(Path(tmp))
        os.environ["PATH"] = f"{fakes.bin}{os.pathsep}{os.environ.get('PATH', '')}"
        try:
            built = build(InferaHooks.load(), fakes, engine, flags)
        except InferaError as exc:
            return f"refused: {fakes.show(str(exc))}"
        return f"{shlex.join(built.argv)}\nenv {built.env}"


if __name__ == "__main__":  # pragma: no cover
    import sys

    print(_draft(sys.argv[1], " ".join(sys.argv[2:])))
