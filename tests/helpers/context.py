"""One way for tests to build a CreateContext, so adding a field to it touches one place."""

from __future__ import annotations

import logging

from wattpipe.pipeline.clock import Clock, SteppedClock
from wattpipe.pipeline.components import ComponentKind, CreateContext
from wattpipe.pipeline.state import StateStore
from wattpipe.pipeline.telemetry import Telemetry


def make_context(
    component_id: str = "test",
    kind: ComponentKind = "processor",
    clock: Clock | None = None,
    *,
    pipeline: str | None = None,
    state: StateStore | None = None,
    telemetry: Telemetry | None = None,
    node_name: str = "n1",
) -> CreateContext:
    clock = clock or SteppedClock()
    telemetry = telemetry or Telemetry(clock)
    logger = logging.getLogger(f"wattpipe.{kind}.{component_id}")
    return CreateContext(
        component_id=component_id,
        kind=kind,
        clock=clock,
        node_name=node_name,
        logger=logger,
        telemetry=telemetry.for_component(kind, component_id, logger),
        state=state or StateStore(None, clock, node_name),
        pipeline=pipeline,
    )
