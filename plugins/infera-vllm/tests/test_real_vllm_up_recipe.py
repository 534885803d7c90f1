"""The copy-paste CPU recipe of docs/how-to/run-engines.md, run as written against real vLLM.

The command is read from the page (its ``export`` lines and the ``infera-run up …`` line),
only the model directory and the engine's Python are replaced by this machine's.
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

import httpx
import pytest
from real_vllm import REPO, engine_env, running_up, vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

PAGE = REPO / "docs" / "how-to" / "run-engines.md"
HEADING = "## vLLM on a CPU, in one command"


def recipe() -> tuple[dict[str, str], list[str]]:
    """(exported variables, argv of `infera-run up …`) from the page's recipe section."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    [block] = [b for b in blocks if "infera-run up" in b]
    exports: dict[str, str] = {}
    command = ""
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            key, _, value = words[1].partition("=")
            exports[key] = value
        elif words[:1] == ["infera-run"]:
            command = line
    assert command, block
    return exports, shlex.split(command, comments=True)


def test_the_documented_cpu_recipe_serves_chat_and_completions(tmp_path: Path) -> None:
    python, model = vllm_python()
    exports, argv = recipe()
    assert argv[:2] == ["infera-run", "up"] and "--engine-python" in argv and "--model-path" in argv
    argv[argv.index("--model-path") + 1] = model
    argv[argv.index("--engine-python") + 1] = python
    env = {**engine_env(tmp_path / "vllm-cache"), **exports}
    with running_up(argv[2:], env) as (url, proc):
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("Dashboard: ")
        assert proc.stdout.readline().startswith("Plane: memory")
        # no --tokenizer in the recipe: the router learns the model from its workers' model card
        # (the ready line may come before the card's tokenizer is built, so wait on /v1/workers)
        admin = url.removesuffix("/v1")
        deadline = time.monotonic() + 120
        while (modes := _modes(admin)) != {"tokens"}:
            assert time.monotonic() < deadline, f"routing mode of tiny on /v1/workers: {modes}"
            time.sleep(0.2)  # polling a condition
        with httpx.Client(base_url=url, timeout=120) as c:
            chat = c.post(
                "/chat/completions",
                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            )
            assert chat.status_code == 200, chat.text
            assert chat.json()["choices"][0]["message"]["role"] == "assistant"
            done = c.post("/completions", json={"model": "tiny", "prompt": "the a of", "max_tokens": 4})
            assert done.status_code == 200, done.text
            assert done.json()["usage"]["completion_tokens"] >= 1


def _modes(admin: str) -> set[str | None]:
    listed = httpx.get(f"{admin}/v1/workers", timeout=10).json()["data"]
    return {w.get("routing_mode") for w in listed if w.get("model") == "tiny"}
