"""The engine's typed errors, in a module of their own: config, webconfig and graph all raise them, and
none of those may import another just for an exception class (that made an import cycle). And the one
wording their messages share: choices listed as a sentence says them."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ConfigError", "alternatives"]


class ConfigError(Exception):
    """One or more problems in a configuration, each a full sentence naming file, line and key."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages


def alternatives(names: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
