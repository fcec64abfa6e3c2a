"""``wattpipe probe <type>`` with no config: one receiver of an installed type, with its default options."""

from __future__ import annotations

import logging
import os

from wattpipe.pipeline.clock import RealClock
from wattpipe.pipeline.components import CreateContext, Receiver, Registry
from wattpipe.pipeline.state import StateStore
from wattpipe.pipeline.telemetry import Telemetry

__all__ = ["default_receiver"]


def default_receiver(registry: Registry, type_name: str) -> Receiver | None:
    """A receiver of ``type_name`` built with its default options (None: no such receiver type installed)."""
    factory = registry.get("receiver", type_name)
    if factory is None:
        return None
    clock = RealClock()
    node = os.uname().nodename
    logger = logging.getLogger(f"wattpipe.receiver.{type_name}")
    ctx = CreateContext(
        component_id=type_name,
        kind="receiver",
        clock=clock,
        node_name=node,
        logger=logger,
        telemetry=Telemetry(clock).for_component("receiver", type_name, logger),
        state=StateStore(None, clock, node),
    )
    receiver = factory.create(ctx, factory.default_config())
    if not isinstance(receiver, Receiver):
        raise TypeError(f"receiver type '{type_name}' built a {type(receiver).__name__}, not a receiver")
    return receiver
