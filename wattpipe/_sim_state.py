"""The state file a simulated node may write (``demo``, ``simulate``): never a real node's.

``wattpipe simulate -c configs/default.yaml`` once wrote the simulated node's totals into the real node's
``/var/lib/wattpipe/state.json``, and the next ``wattpipe run`` there restored them (the state store uses a file
another node wrote, with a warning: a moved volume or a renamed node). So:

- ``simulate`` (a stepped clock: its wall times are not now) keeps its state in its temporary folder, always;
- ``demo`` writes the configured file when there is none yet, or when the simulated node wrote it (a demo
  restarted on its own state: the kill -9 drill), and otherwise keeps its state in its temporary folder.

Either way the configured file is left as it was, and the log says so.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from wattpipe.pipeline.config import Config

__all__ = ["state_for_simulated_node"]

log = logging.getLogger("wattpipe")


def _written_by(path: Path) -> str | None:
    """The node that wrote the state file at ``path`` ("" where it cannot be read as one)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return ""
    return str(data.get("node", "")) if isinstance(data, dict) else ""


def state_for_simulated_node(config: Config, tmp: Path, stepped: bool) -> Config:
    """``config`` with its state file moved into ``tmp`` where writing the configured one could overwrite what
    another (a real) node measured."""
    configured = config.service.state.path
    if not configured:
        return config
    path = Path(configured)
    if not stepped:
        if not path.exists():
            return config
        writer = _written_by(path)
        if writer == config.service.node_name:
            return config
        why = f"written by node {writer}" if writer else "not a state file this node wrote"
    else:
        why = "a stepped clock's state is no node's"
    log.warning("state file %s not used (%s): the simulated node keeps its state in a temporary file", path, why)
    state = config.service.state.model_copy(update={"path": str(tmp / "state.json")})
    return dataclasses.replace(config, service=config.service.model_copy(update={"state": state}))
