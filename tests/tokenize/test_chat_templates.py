"""Chat templates for routing: every source the engine reads, chosen and rendered as vLLM does."""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from infera_core.plugin.hooks import InferaHooks
from infera_core.request import RequestContext
from infera_core.testing.tiny_chat import TEMPLATES, write_templates
from infera_core.testing.tiny_tokenizer import make_tiny_model_dir
from infera_core.tokenize.chat_messages import content_format
from infera_core.tokenize.chat_templates import NoChatTemplateError
from infera_core.tokenize.hf import HfTokenizer
from infera_core.tokenize.service import RoutingTokenizers
from infera_core.tokenize.specs import parse_model_specs

SIMPLE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
TOOLS = "TOOLS {{ tools | length }}: {% for m in messages %}{{ m['content'] }}{% endfor %}"
USER = [{"role": "user", "content": "the a of"}]
TOOL = [{"type": "function", "function": {"name": "f"}}]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))


def model(tmp_path: Path, built: Path, template: Any = None, **files: str) -> Path:
    """A model dir: the tiny tokenizer, ``template`` as tokenizer_config's chat_template, ``files``."""
    out = tmp_path / "model"
    out.mkdir(parents=True)
    shutil.copy(built / "tokenizer.json", out)
    config = json.loads((built / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if template is not None:
        config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    for name, text in files.items():
        path = out / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return out


def render(path: Path, messages: list[dict[str, Any]] = USER, **body: Any) -> str:
    return HfTokenizer(path).render_chat(messages, body)


def test_template_from_chat_template_jinja(tmp_path: Path, built: Path) -> None:
    """What transformers' save_pretrained writes; it wins over tokenizer_config.json."""
    path = model(tmp_path, built, "IGNORED", **{"chat_template.jinja": SIMPLE})
    assert render(path) == "[user] the a of\n"
    tok = HfTokenizer(path)
    assert tok.encode_chat(USER, {}) == tok.encode_offsets("[user] the a of\n")[0]


def test_template_from_chat_template_json_is_used_without_tools(tmp_path: Path, built: Path) -> None:
    path = model(tmp_path, built, **{"chat_template.json": json.dumps({"chat_template": SIMPLE})})
    assert render(path) == "[user] the a of\n"
    with pytest.raises(NoChatTemplateError, match="only a processor chat template"):
        render(path, tools=TOOL)


def test_template_as_a_string_in_tokenizer_config(tmp_path: Path, built: Path) -> None:
    assert render(model(tmp_path, built, SIMPLE)) == "[user] the a of\n"


def test_named_templates_in_tokenizer_config_pick_tool_use_when_tools_are_given(
    tmp_path: Path, built: Path
) -> None:
    path = model(
        tmp_path, built, [{"name": "default", "template": SIMPLE}, {"name": "tool_use", "template": TOOLS}]
    )
    assert render(path) == "[user] the a of\n"
    assert render(path, tools=TOOL) == "TOOLS 1: the a of"
    assert render(path, tools=[]) == "TOOLS 0: the a of"  # an empty list is still "tools given"
    assert render(path, tools=None) == "[user] the a of\n"
    assert render(path, chat_template="default", tools=TOOL) == "[user] the a of\n"  # a name picks it


def test_additional_chat_templates_directory(tmp_path: Path, built: Path) -> None:
    path = model(
        tmp_path, built, **{"chat_template.jinja": SIMPLE, "additional_chat_templates__tool_use.jinja": TOOLS}
    )
    assert render(path) == "[user] the a of\n" and render(path, tools=TOOL) == "TOOLS 1: the a of"
    only_named = model(tmp_path / "b", built, **{"additional_chat_templates__tool_use.jinja": TOOLS})
    with pytest.raises(ValueError, match="none named 'default'"):
        render(only_named)


def test_a_model_without_template_fails_with_one_line_naming_the_files(tmp_path: Path, built: Path) -> None:
    with pytest.raises(NoChatTemplateError) as caught:
        render(model(tmp_path, built))
    message = str(caught.value)
    assert "\n" not in message and "has no chat template" in message
    for name in (
        "chat_template.jinja",
        "additional_chat_templates",
        "chat_template.json",
        "tokenizer_config.json",
    ):
        assert name in message


def test_the_jinja_environment_is_transformers(tmp_path: Path, built: Path) -> None:
    template = (
        "{{ bos_token }}|{{ messages[0] | tojson }}|{{ {'b': 1, 'a': '<&>'} | tojson(indent=1, sort_keys=True) }}"
        "|{{ strftime_now('%Y') }}|{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}|{{ add_generation_prompt }}|{{ flavour }}"
    )
    path = model(tmp_path, built, template)
    text = render(path, [{"role": "user", "content": "ünï <b>"}, {"role": "user", "content": "x"}])
    year = datetime.now().year
    assert text.startswith('<s>|{"role": "user", "content": "ünï <b>"}|{\n "a": "<&>",\n "b": 1\n}|')
    assert text.endswith("|ünï <b>|True|") and str(year) in text
    # chat_template_kwargs reach the template (and may override special tokens); the
    # request's own add_generation_prompt wins over one in the kwargs, as in vLLM
    body = {"chat_template_kwargs": {"flavour": "mint", "bos_token": "B", "add_generation_prompt": False}}
    text = render(path, **body)
    assert text.startswith("B|") and text.endswith("|True|mint")
    failing = model(tmp_path / "c", built, "{{ raise_exception('no system role') }}")
    with pytest.raises(Exception, match="no system role"):
        render(failing)


def test_content_parts_follow_the_templates_content_format(tmp_path: Path, built: Path) -> None:
    assert content_format(SIMPLE) == "string"
    assert content_format(TEMPLATES["default"]) == "string"
    assert content_format(TEMPLATES["tool_use"]) == "openai"  # through a macro parameter
    loop = "{% for m in messages %}{% for p in m['content'] %}<{{ p['text'] }}>{% endfor %}{% endfor %}"
    assert content_format(loop) == "openai"
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert render(model(tmp_path, built, SIMPLE), parts) == "[user] a\nb\n"  # vLLM joins with "\n"
    assert render(model(tmp_path / "b", built, loop), parts) == "<a><b>"
    with pytest.raises(ValueError, match="image_url"):
        render(model(tmp_path / "c", built, SIMPLE), [{"role": "user", "content": [{"type": "image_url"}]}])


def test_continue_final_message_leaves_the_last_message_open(tmp_path: Path, built: Path) -> None:
    path = model(tmp_path, built, SIMPLE)
    messages = [*USER, {"role": "assistant", "content": "to be"}]
    open_ended = render(path, messages, continue_final_message=True, add_generation_prompt=False)
    assert open_ended == "[user] the a of\n[assistant] to be"
    with pytest.raises(ValueError, match="cannot both be true"):
        render(path, messages, continue_final_message=True)


def test_developer_messages_become_one_system_message_unless_the_template_knows_them(
    tmp_path: Path, built: Path
) -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "developer", "content": "d"}, *USER]
    assert render(model(tmp_path, built, SIMPLE), messages) == "[system] s\n\nd\n[user] the a of\n"
    knows = SIMPLE + "{# 'developer' #}"
    assert render(model(tmp_path / "b", built, knows), messages).count("[developer] d") == 1


def test_tools_and_tool_calls_are_given_as_vllm_gives_them(tmp_path: Path, built: Path) -> None:
    template = (
        "{{ tools | tojson }}{% for m in messages if m.tool_calls %}{{ m.tool_calls | tojson }}{% endfor %}"
    )
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]}]
    text = render(model(tmp_path, built, template), messages, tools=[{**TOOL[0], "extra": 1}])
    tools, calls = text.split("]", 1)
    assert json.loads(tools + "]") == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": None}}
    ]
    assert '"arguments": {"x": 1}' in calls  # arguments parsed from JSON into an object


def test_the_tiny_models_templates_render_tools_and_parts(tmp_path: Path, built: Path) -> None:
    path = model(tmp_path, built)
    write_templates(path)
    messages = [{"role": "system", "content": [{"type": "text", "text": "be brief"}]}, *USER]
    assert render(path, messages) == "<s>system\nbe brief</s>\n<s>user\nthe a of</s>\n<s>assistant\n"
    with_tools = render(path, messages, tools=TOOL)
    assert (
        with_tools.startswith('<s>system\nbe brief\n# Tools\n{"type": "function"')
        and "<s>user\n" in with_tools
    )


async def test_a_system_field_on_a_chat_request_is_not_rendered(tmp_path: Path, built: Path) -> None:
    """vLLM ignores it; /v1/messages requests reach the tokenizer already mapped to chat messages."""
    path = model(tmp_path, built, SIMPLE)
    tokens = RoutingTokenizers(InferaHooks.load().catalog().tokenizers, parse_model_specs([f"m=hf:{path}"]))
    ctx = RequestContext("r1", "m", "/v1/chat/completions", {"messages": USER, "system": "s"})
    await tokens.fill(ctx)
    assert ctx.token_ids == HfTokenizer(path).encode_offsets("[user] the a of\n")[0]
