"""The engine's typed errors, in a module of their own: config, webconfig and graph all raise them, and
none of those may import another just for an exception class (that made an import cycle)."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(Exception):
    """One or more problems in a configuration, each a full sentence naming file, line and key."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages
