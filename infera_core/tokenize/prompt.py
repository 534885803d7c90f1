"""A request's prompt as routing sees it: token ids a client sent, its size, the cut that
keeps tokenizing bounded, and what a token list costs in memory."""

from __future__ import annotations

from typing import Any


def ids_bytes(ids: list[int]) -> int:
    """Approximate bytes a list of token ids holds (the list and an int object per id)."""
    return 64 + 36 * len(ids)


def shared_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def cut_messages(messages: list[Any], limit: int) -> list[Any]:
    """The messages whose contents fit in ``limit`` characters, the last one cut: for a
    tokenizer that cannot render its template to text, the start of the rendered prompt."""
    out: list[Any] = []
    left = limit
    for m in messages:
        if left <= 0:
            break
        content = m.get("content") if isinstance(m, dict) else None
        if content is None:
            out.append(m)
            continue
        text = content if isinstance(content, str) else _text(content)
        if len(text) > left:
            m = {**m, "content": text[:left]}
        out.append(m)
        left -= len(text)
    return out


def given_tokens(body: dict[str, Any]) -> list[int] | None:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):
            return prompt if all(isinstance(t, int) for t in prompt) else None
        if isinstance(first, list) and first and all(isinstance(t, int) for t in first):
            return first
    return None


def completion_prompt(body: dict[str, Any]) -> str:
    """The text prompt of a completions body (of a list of prompts, the first: the one routing
    looks at); ``ValueError`` when there is no text prompt to tokenize."""
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
    if not isinstance(prompt, str):
        raise ValueError("no prompt or messages to tokenize")
    return prompt


def _text(content: Any) -> str:
    """A message's content as one string (text parts joined): what the cut measures."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def prompt_size(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt)
    messages = body.get("messages")
    if isinstance(messages, list):
        n = 0
        for m in messages:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                n += len(c)
            elif isinstance(c, list):  # text parts by their length, not str() of the whole list
                n += sum(len(t) if isinstance(t, str) else len(str(t)) for t in _part_texts(c))
            elif c is not None:
                n += len(str(c))
        return n
    return 0


def _part_texts(parts: list[Any]) -> list[Any]:
    """Each part's text (a string), or the part itself where it has none (an image: what
    it holds counts too, so a body of big images is still a big prompt)."""
    return [p["text"] if isinstance(p, dict) and isinstance(p.get("text"), str) else p for p in parts]


def cut_contents(messages: list[Any], limit: int) -> list[Any]:
    """``messages`` whose text (string contents and text parts, in order) holds at most
    ``limit`` characters: the text past that is dropped, every message and part kept (the
    template sees the same roles, turns and tools). A template that renders contents in
    order renders the same first ``limit`` characters as for the whole messages, for a
    bounded cost whatever the body's size."""
    out: list[Any] = []
    left = limit
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            if len(content) > left:
                m = {**m, "content": content[:left]}
            left -= len(m["content"])
        elif isinstance(content, list):
            parts: list[Any] = []
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                if isinstance(text, str):
                    if len(text) > left:
                        part = {**part, "text": text[:left]}
                    left -= len(part["text"])
                parts.append(part)
            m = {**m, "content": parts}
        out.append(m)
    return out
