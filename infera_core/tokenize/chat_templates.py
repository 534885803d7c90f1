"""A model's chat templates, found, chosen and compiled the way the engine does it.

Where they come from (transformers 5's ``from_pretrained``, which vLLM 0.32 uses):

* ``chat_template.jinja`` — the template ``save_pretrained`` writes (named ``default``);
* ``additional_chat_templates/<name>.jinja`` — more named templates (e.g. ``tool_use``);
* ``chat_template`` in ``tokenizer_config.json`` — a string, or a list of
  ``{"name", "template"}`` — used only when none of the files above exists;
* ``chat_template.json`` (``{"chat_template": ...}``) — a processor's template: vLLM prefers it
  for requests without ``tools`` and falls back to the tokenizer's otherwise.

Which one renders a request (vLLM's ``resolve_chat_template`` + transformers'
``get_chat_template``): the request's ``chat_template`` (a template name, or the template
itself); else, without ``tools``, the processor's; else, of named templates, ``tool_use``
when the request has ``tools`` (an empty list counts) and that name exists, otherwise
``default``.

Templates compile in transformers' environment: a jinja2 ``ImmutableSandboxedEnvironment``
with ``trim_blocks``, ``lstrip_blocks``, the ``loopcontrols`` extension and the
``{% generation %}`` tag, a ``tojson`` filter that does not escape HTML
(``json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)``),
and the globals ``raise_exception`` and ``strftime_now``.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

LOOKED_FOR = (
    "chat_template.jinja, additional_chat_templates/*.jinja, chat_template.json "
    "and 'chat_template' in tokenizer_config.json"
)
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class NoChatTemplateError(ValueError):
    """The model has no chat template (one line naming the files looked for)."""


class _Generation(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}`` renders its body (transformers tracks it)."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=64)
def compile_template(source: str) -> jinja2.Template:
    """``source`` compiled in transformers' chat-template environment (cached)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None


class ChatTemplates:
    """The chat templates and special tokens of one model directory."""

    __slots__ = ("processor", "special_tokens", "templates", "where")

    def __init__(self, where: str, config: dict[str, Any], directory: Path | None) -> None:
        self.where = where
        self.templates: str | dict[str, str] | None = None
        self.processor: str | None = None
        files: dict[str, str] = {}
        if directory is not None:
            main = directory / "chat_template.jinja"
            if main.is_file():
                files["default"] = main.read_text(encoding="utf-8")
            extra = directory / "additional_chat_templates"
            if extra.is_dir():
                for f in sorted(extra.glob("*.jinja")):
                    files[f.name.removesuffix(".jinja")] = f.read_text(encoding="utf-8")
            proc = directory / "chat_template.json"
            if proc.is_file():
                loaded = _read_json(proc)
                value = loaded.get("chat_template") if isinstance(loaded, dict) else None
                self.processor = value if isinstance(value, str) else None
        if files:
            self.templates = files["default"] if list(files) == ["default"] else files
        else:
            value = config.get("chat_template")
            if isinstance(value, str):
                self.templates = value
            elif isinstance(value, list):
                self.templates = {
                    str(t["name"]): str(t["template"])
                    for t in value
                    if isinstance(t, dict) and "name" in t and "template" in t
                }
        self.special_tokens = _special_tokens(config, directory)

    @property
    def sources(self) -> list[str]:
        """Every template's text (for the fingerprint)."""
        out = [self.processor] if self.processor else []
        if isinstance(self.templates, str):
            out.append(self.templates)
        elif self.templates:
            out += [f"{k}\0{v}" for k, v in sorted(self.templates.items())]
        return out

    def select(self, requested: str | None, tools: list[Any] | None) -> str:
        """The template source that renders a request (see the module docstring)."""
        named = self.templates if isinstance(self.templates, dict) else None
        if requested is not None:
            return named[requested] if named is not None and requested in named else requested
        if tools is None and self.processor is not None:
            return self.processor
        if named is not None:
            if tools is not None and "tool_use" in named:
                return named["tool_use"]
            if "default" in named:
                return named["default"]
            raise ValueError(
                f"{self.where} has several chat templates and none named 'default' "
                f"(names: {', '.join(sorted(named))})"
            )
        if isinstance(self.templates, str):
            return self.templates
        if tools is None or self.processor is None:
            raise NoChatTemplateError(f"{self.where} has no chat template (looked for {LOOKED_FOR})")
        raise NoChatTemplateError(
            f"{self.where} has only a processor chat template (chat_template.json); "
            "the engine does not use it for requests with tools"
        )


def _special_tokens(config: dict[str, Any], directory: Path | None) -> dict[str, str]:
    """transformers' ``special_tokens_map`` (+ model-specific ``*_token`` entries): template variables."""
    merged: dict[str, Any] = {}
    legacy = directory / "special_tokens_map.json" if directory is not None else None
    if legacy is not None and legacy.is_file():
        loaded = _read_json(legacy)
        if isinstance(loaded, dict):
            merged.update(loaded)
    merged.update(config)
    out: dict[str, str] = {}
    for key, value in merged.items():
        text = _token_text(value)
        if text is not None and (key in SPECIAL_TOKENS or key.endswith("_token")):
            out[key] = text
    extra = merged.get("extra_special_tokens")
    if isinstance(extra, dict):
        for key, value in extra.items():
            text = _token_text(value)
            if text is not None:
                out[str(key)] = text
    return out
