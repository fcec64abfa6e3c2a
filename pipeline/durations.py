"""Durations as configuration writes them: ``500ms``, ``5s``, ``2m``, ``1h``, ``1m30s`` → seconds, and back."""

from __future__ import annotations

import re

__all__ = ["format_duration", "parse_duration"]

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: object) -> float:
    """``500ms``, ``5s``, ``2m``, ``1h``, ``1m30s`` or a plain number of seconds → seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration, like 500ms, 5s or 2m, is needed here, not true/false")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        pos, seconds = 0, 0.0
        for match in _DURATION_RE.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_S[match.group(2)]
            pos = match.end()
        if pos != len(text) or not text:
            raise ValueError(f"'{value}' is not a duration; write it like 500ms, 5s, 2m or 1h")
    else:
        raise ValueError(f"a duration, like 500ms, 5s or 2m, is needed here, not {type(value).__name__}")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def format_duration(seconds: float) -> str:
    if seconds == 0:
        return "0s"
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    if (seconds * 1000).is_integer():
        return f"{int(seconds * 1000)}ms"
    return f"{seconds}s"
