"""The chat templates of the real-vLLM tests' tiny model (``make_tiny_model.py`` writes them).

Two named templates, as ``save_pretrained`` stores a dict of templates:
``chat_template.jinja`` (``default``) and ``additional_chat_templates/tool_use.jinja``
(``tool_use``, which the engine picks when a request has ``tools``). Between them they use
what real templates use: the string and the *openai* (content-part list) content formats,
a macro, ``loopcontrols``, ``{% generation %}``, ``raise_exception``, ``tojson`` with and
without arguments, special tokens, tool calls and tool results, reasoning, a participant
``name``, a ``chat_template_kwargs`` variable (``default_system``), and the developer role
(known to ``tool_use`` only, so the engine turns it into ``system`` for ``default``).
"""

from __future__ import annotations

from pathlib import Path

DEFAULT = (
    "{%- if messages[0]['role'] != 'system' and default_system is defined -%}"
    "<s>system\n{{ default_system }}</s>\n"
    "{% endif %}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "<s>assistant\n"
    "{% if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{% endif %}"
    "{% generation %}{{ message['content'] }}"
    "{% for call in message.tool_calls or [] %}<call>{{ call.function.name }} "
    "{{ call.function.arguments | tojson }}</call>{% endfor %}"
    "{% endgeneration %}{{ eos_token }}\n"
    "{% elif message['role'] == 'tool' %}"
    "<s>tool {{ message.tool_call_id }}\n{{ message['content'] }}</s>\n"
    "{% else %}"
    "<s>{{ message['role'] }}{{ ' (' + message.name + ')' if message.name else '' }}\n"
    "{{ message['content'] }}</s>\n"
    "{% endif %}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<s>assistant\n{% endif -%}"
)

TOOL_USE = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- else -%}{% for part in content %}{% if not loop.first %} | {% endif %}{{ part['text'] }}{% endfor %}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{{ bos_token }}system\n"
    "{% if messages[0]['role'] == 'system' %}{{ text(messages[0]['content']) }}\n{% endif %}"
    "# Tools\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "</s>\n"
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] == 'system' -%}{%- continue -%}{%- endif -%}"
    "{%- if message['role'] not in ['user', 'assistant', 'tool', 'system', 'developer'] -%}"
    "{{ raise_exception('unknown role: ' + message['role']) }}"
    "{%- endif -%}"
    "<s>{{ message['role'] }}\n{{ text(message['content']) }}"
    "{% for call in message.tool_calls or [] %}"
    '<tool_call>{"name": "{{ call.function.name }}", "arguments": '
    "{{ call.function.arguments | tojson(sort_keys=True) }}}</tool_call>"
    "{% endfor %}"
    "</s>\n"
    "{% endfor -%}"
    "{%- if add_generation_prompt %}<s>assistant\n{% endif -%}"
)

TEMPLATES = {"default": DEFAULT, "tool_use": TOOL_USE}


def write_templates(model_dir: Path) -> None:
    """Write :data:`TEMPLATES` into ``model_dir`` as ``save_pretrained`` lays them out."""
    (model_dir / "chat_template.jinja").write_text(DEFAULT, encoding="utf-8")
    extra = model_dir / "additional_chat_templates"
    extra.mkdir(exist_ok=True)
    (extra / "tool_use.jinja").write_text(TOOL_USE, encoding="utf-8")
