"""The root cause of an engine that died: the first exception line of its output.

An engine that fails at start usually prints a chain of tracebacks whose *last* lines
say little (vLLM's end in ``RuntimeError: Engine core initialization failed. See root
cause above.``): the cause is the first ``SomethingError: message`` line. Log prefixes
(``(EngineCore pid=12) ERROR 12-04 17:20:01 [core.py:700] ``) are cut off.
"""

from __future__ import annotations

import re

_EXCEPTION = re.compile(
    r"^(?:\([^)]*\)\s+)?"  # (EngineCore pid=12)
    r"(?:[A-Z]+\s+\d\d-\d\d\s+[\d:.]+\s+\[[^\]]*\]\s+)?"  # ERROR 12-04 17:20:01 [core.py:700]
    r"(?:\[[^\]]*\]\s+)?"  # [2026-12-04 17:20:01] (SGLang)
    r"((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)):\s+(\S.*)$"
)
"""An exception line (``ValueError: …``), only at the start of a line after a log prefix:
a warning that merely mentions one (``… like `OSError: [Errno 24] …` ``) is not a cause."""


def error_line(line: str) -> str | None:
    """``ValueError: message`` when ``line`` reports an exception (log prefix removed), else None."""
    m = _EXCEPTION.search(line.rstrip())
    if m is None:
        return None
    return f"{m.group(1)}: {m.group(2)}"
