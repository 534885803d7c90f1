"""Chat messages and tools as vLLM 0.32 hands them to the chat template.

vLLM does not give the template the request's messages verbatim (``renderers/chat_utils.py``
and ``renderers/hf.py``); this module applies the same changes, so the router renders the
prompt the engine renders:

* **content**: a string becomes one text part; ``None`` no parts. Text parts (``text``,
  ``input_text``, ``output_text``, ``refusal``, ``thinking``) are kept. For a template in the
  *string* content format the texts are joined with ``"\\n"``; for one in the *openai* format
  (the template loops over a message's content) they stay a list of
  ``{"type": "text", "text": ...}``. Which format: :func:`content_format`, vLLM's
  auto-detection on the template's syntax tree. Media parts are not tokenized here
  (:class:`ValueError`: the request is then routed without token ids).
* **per role**: assistant ``tool_calls`` are kept, their ``arguments`` parsed from JSON into an
  object (``{}`` when empty or not an object), an empty list dropped; ``reasoning`` is also
  given as ``reasoning_content``; a tool message keeps ``tool_call_id`` and its text parts
  joined with ``"\\n"``; ``name`` is kept; other fields are dropped. A ``developer`` message
  becomes ``system`` when the template never names the developer role, and system messages
  are then merged into one first message (joined with a blank line).
* **tools**: each as vLLM's request model dumps it: ``{"type": "function", "function":
  {"name", "description", "parameters"}}`` (absent ones as ``None``; ``strict`` and
  ``defer_loading`` only when set), unknown fields dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import jinja2.nodes

from infera_core.tokenize.chat_templates import compile_template

TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}
BILLING_HEADER = "x-anthropic-billing-header"


# -- content format: does the template loop over a message's content? ------------------------
def _unwrap(node: jinja2.nodes.Node) -> jinja2.nodes.Node:
    """``x | f``, ``x is t`` and ``x[a:b]`` all stand for ``x``."""
    while True:
        filtered = isinstance(node, jinja2.nodes.Filter) and node.node is not None
        sliced = isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice)
        if not (filtered or sliced or isinstance(node, jinja2.nodes.Test)):
            return node
        node = node.node  # type: ignore[attr-defined]


def _name(node: jinja2.nodes.Node) -> str | None:
    node = _unwrap(node)
    return node.name if isinstance(node, jinja2.nodes.Name) and node.ctx == "load" else None


def _field_of(node: jinja2.nodes.Node, names: set[str], key: str) -> bool:
    """``node`` is ``n.key`` or ``n['key']`` (possibly filtered or sliced) for ``n`` in ``names``."""
    node = _unwrap(node)
    if isinstance(node, jinja2.nodes.Getattr):
        return node.attr == key and _name(node.node) in names
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Const):
        return node.arg.value == key and _name(node.node) in names
    return False


def _aliases(root: jinja2.nodes.Template, name: str) -> set[str]:
    """``name`` and every variable ``{% set %}`` from it (transitively)."""
    found = {name}
    changed = True
    while changed:
        changed = False
        for assign in root.find_all(jinja2.nodes.Assign):
            target = assign.target
            if (
                isinstance(target, jinja2.nodes.Name)
                and target.name not in found
                and _name(assign.node) in found
            ):
                found.add(target.name)
                changed = True
    return found


def _content_loops(root: jinja2.nodes.Template) -> Iterator[jinja2.nodes.For]:
    lists = _aliases(root, "messages")
    loops = list(root.find_all(jinja2.nodes.For))
    items = {
        loop.target.name
        for loop in loops
        if isinstance(loop.target, jinja2.nodes.Name) and _name(loop.iter) in lists
    }
    in_macro: dict[int, set[str]] = {}  # loop id -> macro parameters bound to a message's content
    for macro in root.find_all(jinja2.nodes.Macro):
        params = [a.name for a in macro.args]
        bound: set[str] = set()
        for call in root.find_all(jinja2.nodes.Call):
            if _name(call.node) != macro.name:
                continue
            bound |= {
                params[i] for i, a in enumerate(call.args[: len(params)]) if _field_of(a, items, "content")
            }
            bound |= {k.key for k in call.kwargs if k.key in params and _field_of(k.value, items, "content")}
        for loop in macro.find_all(jinja2.nodes.For):
            in_macro[id(loop)] = bound
    for loop in loops:
        params_of_macro = in_macro.get(id(loop))
        name = loop.iter.name if isinstance(loop.iter, jinja2.nodes.Name) else None
        macro_param = params_of_macro is not None and name in params_of_macro
        bare_content = params_of_macro is None and name == "content"
        if macro_param or bare_content or _field_of(loop.iter, items, "content"):
            yield loop


@lru_cache(maxsize=64)
def content_format(source: str) -> str:
    """``"openai"`` when the template iterates a message's content, else ``"string"``."""
    try:
        root = compile_template(source).environment.parse(source)
    except jinja2.TemplateError:
        return "string"
    return "openai" if next(_content_loops(root), None) is not None else "string"


# -- messages -------------------------------------------------------------------------------------
def _texts(role: str, content: Any, where: str) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        content = [content]
    if not isinstance(content, list):
        raise ValueError(f"{where}.content must be a string or a list of parts")
    out: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, str):
            text: Any = part
            extra: dict[str, Any] = {}
        elif isinstance(part, dict):
            kind = part.get("type")
            if kind == "thinking":
                text = part.get("thinking")
            elif kind in TEXT_PARTS:
                text = part.get(TEXT_PARTS[kind])
            else:
                raise ValueError(f"{where}: content part {kind!r} is not tokenized for routing")
            extra = {k: v for k, v in part.items() if k not in ("type", "text", "thinking", "refusal")}
        else:
            raise ValueError(f"{where}: a content part must be a string or an object")
        if text is None:
            continue
        if role == "system" and isinstance(text, str) and text.startswith(BILLING_HEADER):
            text = text.partition("\n")[2]  # vLLM drops Claude Code's per-request header line
            if not text:
                continue
        out.append({"type": "text", "text": str(text), **extra})
    return out


def _arguments(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if not value:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def _tool_calls(calls: list[Any]) -> list[dict[str, Any]]:
    out = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise ValueError("assistant tool_calls entries must be objects with a function")
        if call.get("type", "function") != "function":
            raise ValueError("only tool_calls of type 'function' are supported")
        fn = dict(call["function"])
        fn["arguments"] = _arguments(fn.get("arguments"))
        out.append({**call, "function": fn})
    return out


def conversation(messages: list[Any], fmt: str) -> list[dict[str, Any]]:
    """``messages`` as the template sees them, for content format ``fmt`` (``string``/``openai``)."""
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise ValueError(f"{where} must be an object with a string role")
        role = msg["role"]
        parts = _texts(role, msg.get("content"), where)
        texts = "\n".join(p["text"] for p in parts)
        conv: dict[str, Any] = {"role": role, "content": parts if fmt == "openai" else texts}
        if role == "assistant":
            calls = msg.get("tool_calls")
            if isinstance(calls, list) and calls:
                conv["tool_calls"] = _tool_calls(calls)
            if msg.get("reasoning") is not None:
                conv["reasoning"] = conv["reasoning_content"] = msg["reasoning"]
        elif role == "tool":
            if "tool_call_id" in msg:
                conv["tool_call_id"] = msg["tool_call_id"]
            conv["content"] = texts
        if isinstance(msg.get("name"), str):
            conv["name"] = msg["name"]
        if isinstance(msg.get("task"), str):
            conv["task"] = msg["task"]
        if role == "developer":
            conv["tools"] = msg.get("tools")
        out.append(conv)
    return out


def developer_as_system(conv: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """``developer`` → ``system`` (merged first) when the template has no developer role."""
    if not any(m["role"] == "developer" for m in conv) or '"developer"' in source or "'developer'" in source:
        return conv
    conv = [
        {**{k: v for k, v in m.items() if k != "tools"}, "role": "system"} if m["role"] == "developer" else m
        for m in conv
    ]
    systems = [i for i, m in enumerate(conv) if m["role"] == "system"]
    if not systems or systems == [0]:
        return conv
    texts = []
    for i in systems:
        content = conv[i].get("content")
        if isinstance(content, list):
            content = "\n".join(p["text"] for p in content if isinstance(p, dict) and "text" in p)
        if content:
            texts.append(content)
    return [{"role": "system", "content": "\n\n".join(texts)}, *(m for m in conv if m["role"] != "system")]


# -- tools ----------------------------------------------------------------------------------------
def tools_as_engine_sees(tools: Any) -> list[dict[str, Any]] | None:
    """The request's ``tools`` as vLLM's request model dumps them (``None`` when absent)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ValueError("tools must be a list")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"tools[{i}] must be an object with a function that has a name")
        if tool.get("type", "function") != "function":
            raise ValueError(f"tools[{i}].type must be 'function'")
        dumped: dict[str, Any] = {
            "name": fn["name"],
            "description": fn.get("description"),
            "parameters": fn.get("parameters"),
        }
        if fn.get("strict") is not None:
            dumped["strict"] = fn["strict"]
        defer = tool.get("defer_loading")
        fn_defer = defer if fn.get("defer_loading") is None else fn["defer_loading"]
        if fn_defer is not None:
            dumped["defer_loading"] = fn_defer
        entry: dict[str, Any] = {"type": "function", "function": dumped}
        if defer is not None:
            entry["defer_loading"] = defer
        out.append(entry)
    return out
