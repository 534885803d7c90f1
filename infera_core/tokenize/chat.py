"""A chat request rendered to the prompt text the engine tokenizes (vLLM 0.32 + transformers 5).

The steps vLLM's chat completions and ``/tokenize`` take, in order:

1. the template: :meth:`ChatTemplates.select` with the request's ``chat_template`` and ``tools``;
2. the messages: :func:`~infera_core.tokenize.chat_messages.conversation` in the template's
   content format, then ``developer`` → ``system`` when the template lacks that role;
3. the template variables: the special tokens (``bos_token``, ``eos_token``…), then
   ``chat_template_kwargs`` from the request (they may override special tokens), then
   ``tools``, ``documents``, ``add_generation_prompt`` (default true) and
   ``continue_final_message`` (default false) from the request's own fields, which win over
   the same keys in ``chat_template_kwargs`` — except ``tools``, where the kwargs win, as in
   vLLM. ``reasoning_effort`` is passed too, and sets ``enable_thinking`` unless the kwargs do;
4. ``continue_final_message``: the final message is rendered open-ended (transformers cuts the
   prompt right after its content).

The caller tokenizes the text with ``add_special_tokens`` from the request (default false).
"""

from __future__ import annotations

import copy
from typing import Any

from infera_core.tokenize.chat_messages import (
    content_format,
    conversation,
    developer_as_system,
    tools_as_engine_sees,
)
from infera_core.tokenize.chat_templates import ChatTemplates, compile_template

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_UNSET = (None, "auto")


def _merge(defaults: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``merge_kwargs``: ``overrides`` win unless they are ``None`` or ``"auto"``."""
    return defaults | {k: v for k, v in overrides.items() if not any(v is u or v == u for u in _UNSET)}


def template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """The variables a chat request gives its template (step 3 of the module docstring)."""
    user = body.get("chat_template_kwargs")
    if user is None:
        user = {}
    if not isinstance(user, dict):
        raise ValueError("chat_template_kwargs must be an object")
    if user.get("chat_template") is not None or "tokenize" in user:
        raise ValueError("chat_template_kwargs may not set chat_template or tokenize")
    own: dict[str, Any] = {
        "add_generation_prompt": body.get("add_generation_prompt", True),
        "continue_final_message": body.get("continue_final_message", False),
        "documents": body.get("documents"),
        "reasoning_effort": body.get("reasoning_effort"),
    }
    if body.get("reasoning_effort") is not None and "enable_thinking" not in user:
        own["enable_thinking"] = body["reasoning_effort"] != "none"
    kwargs = _merge(user, own)
    kwargs = _merge({"tools": tools_as_engine_sees(body.get("tools"))}, kwargs)
    kwargs.setdefault("add_generation_prompt", False)
    kwargs.setdefault("continue_final_message", False)
    kwargs.setdefault("documents", None)
    return kwargs


def render_chat(templates: ChatTemplates, messages: list[Any], body: dict[str, Any]) -> str:
    """The prompt text the engine renders for a chat request with ``messages``."""
    kwargs = template_kwargs(body)
    requested = body.get("chat_template")
    source = templates.select(requested if isinstance(requested, str) else None, kwargs.get("tools"))
    if not messages:
        raise ValueError("messages is empty")
    conv = developer_as_system(conversation(messages, content_format(source)), source)
    cont = kwargs.pop("continue_final_message")
    if cont and kwargs["add_generation_prompt"]:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
    documents = kwargs.get("documents")
    if documents is not None and not all(isinstance(d, dict) for d in documents):
        raise ValueError("documents must be a list of objects")
    variables = {**templates.special_tokens, **kwargs}
    if not cont:
        return str(compile_template(source).render(messages=conv, **variables))
    return _render_open_ended(source, conv, "content" if cont is True else str(cont), variables)


def _render_open_ended(source: str, conv: list[dict[str, Any]], field: str, variables: dict[str, Any]) -> str:
    """transformers' ``continue_final_message``: tag the final message, render, cut at the tag."""
    conv = copy.deepcopy(conv)
    final = conv[-1].get(field)
    if final is None:
        raise ValueError(f'continue_final_message is set but the final message has no "{field}"')
    if field not in source:
        raise ValueError(f'continue_final_message is set to "{field}", which the chat template never uses')
    if isinstance(final, list):
        for block in reversed(final):
            if "text" in block:
                final = block["text"]
                block["text"] = block["text"] + _CONTINUE_TAG
                break
        else:
            raise ValueError("continue_final_message is set but the final message has no text")
    else:
        conv[-1][field] = final + _CONTINUE_TAG
    text = str(compile_template(source).render(messages=conv, **variables))
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise ValueError("continue_final_message: the chat template drops part of the final message")
    at = text.rindex(tag)
    return text[:at] if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()
