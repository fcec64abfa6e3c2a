"""Exporter ``otlp``: every catalog family, under its OpenTelemetry name, pushed to an OTLP endpoint.

This module wires parts that each do one job:

- ``_otlp_snapshot.py``: on the tick, ``export(batch)`` only takes a snapshot of the batch's points (values,
  attributes, timestamps);
- ``_queued_sender.py``: a bounded queue and a background sender with the Collector's retry and backoff,
  counted drops and a flush at shutdown, the same for any pushing exporter;
- ``_send_log.py``: an outage logged once when it begins and once when it ends (and a full queue once until
  it drains), never per attempt: every failed attempt is counted in ``wattpipe_exporter_failed_total``;
- ``_otlp_encode.py`` and ``_otlp_delta.py``: on the sender thread, the snapshot becomes hand-built
  ``MetricsData`` with explicit timestamps, counters as deltas with ``temporality: delta``;
- ``_otlp_sdk.py``: the OpenTelemetry SDK's ``OTLPMetricExporter`` (gRPC or HTTP/protobuf) sends it, its own
  per-attempt log lines becoming the detail of the outage's one line.

Why a collector outage costs resolution, not joules: energy is exported as cumulative totals, so the first
export after recovery carries everything since each series began. The queue (``queue_size`` batches)
drops its oldest batch when full; those drops are counted in ``wattpipe_exporter_dropped_total``. With
``temporality: delta`` the delta is taken at send time against what was last *sent* for the series, so a
dropped batch widens the next delta instead of losing its energy (see docs/otlp.md).
"""

from __future__ import annotations

import socket
from typing import Any

from opentelemetry.sdk.resources import Resource

from wattpipe.exporters._otlp_config import OtlpConfig  # defined there (the SDK glue needs it too), exported here
from wattpipe.exporters._otlp_delta import DeltaState
from wattpipe.exporters._otlp_encode import Encoder
from wattpipe.exporters._otlp_sdk import SDK_LOGS, Sender, export_once, make_sender, uses_tls
from wattpipe.exporters._otlp_snapshot import Snapshot, SnapshotTaker
from wattpipe.exporters._queued_sender import QueuedSender, QueueSettings
from wattpipe.exporters._send_log import SendLog
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.components import CreateContext, Factory

__all__ = ["OtlpConfig", "OtlpExporter", "factory"]

_Snapshot = Snapshot
"""The queued type under its former name: tests/e2e/test_drill_otlp.py counts and traces snapshots by it."""


def queue_settings(config: OtlpConfig) -> QueueSettings:
    return QueueSettings(
        queue_size=config.queue_size,
        initial_interval_s=config.retry_initial_interval,
        max_interval_s=config.retry_max_interval,
        max_elapsed_s=config.retry_max_elapsed_time,
        shutdown_timeout_s=config.shutdown_timeout,
        attempt_timeout_s=config.timeout,
    )


def _resource(config: OtlpConfig, node_name: str) -> Resource:
    return Resource.create(
        {
            "service.name": "wattpipe",
            # The node name by default, not a random id: a restarted agent continues the same series.
            "service.instance.id": config.service_instance_id or node_name,
            "host.name": socket.gethostname(),
            "k8s.node.name": node_name,
        }
    )


class OtlpExporter:
    def __init__(self, config: OtlpConfig, ctx: CreateContext) -> None:
        self.config = config
        self.component_id = ctx.component_id
        self.log = ctx.logger
        self.resource = _resource(config, ctx.node_name)
        self._snapshots = SnapshotTaker(created_ns=ctx.clock.now().wall_ns)
        self._delta = DeltaState() if config.temporality == "delta" else None
        self._encoder = Encoder(self.resource, self._delta)
        self._state, self._state_key = ctx.state, ctx.state_key
        if ctx.state.path is not None:  # checkpointed: a component's ``snapshot()``
            self.snapshot = self._state_snapshot
        self._sdk: Sender | None = None
        settings = queue_settings(config)
        events = SendLog(
            self.component_id,
            config.resolved_endpoint(),
            settings,
            ctx.telemetry,
            ctx.logger,
            after_give_up="cumulative totals carry their energy in the next batch sent",
        )
        self.sender: QueuedSender[Snapshot] = QueuedSender(
            f"wattpipe-{self.component_id}", self._send, settings, ctx.telemetry, events
        )

    @property
    def devices(self) -> dict[str, dict[str, str]]:
        return self._snapshots.devices

    @property
    def queued(self) -> int:
        return self.sender.queued

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        if self.sender.running:
            return
        self._restore()
        self._sdk = self._sdk or make_sender(self.config)
        SDK_LOGS.install()
        self._warn_unused_tls_files()
        self.sender.start()
        self.log.info("sending OTLP (%s) to %s", self.config.protocol, self.config.resolved_endpoint())

    async def shutdown(self) -> None:
        if not self.sender.running:
            return
        await self.sender.shutdown()
        if self._sdk is not None:
            self._sdk.shutdown(timeout_millis=1000)
            self._sdk = None

    # --- state: the process starts sent and, with delta temporality, what was last sent go on across a restart

    def _restore(self) -> None:
        saved = self._state.section(self._state_key)
        if not saved:
            return
        self._snapshots.keep_starts(saved.get("process_starts"))  # (a section written before these were kept: none)
        ticks = saved.get("ticks_ns")  # each pipeline's last tick time (a clock stepped back meanwhile)
        if isinstance(ticks, dict):
            self._snapshots.ticks_ns.update({str(k): v for k, v in ticks.items() if type(v) is int})
        if self._delta is None or len(self._delta):
            return
        rows = saved.get("delta_last_sent")
        taken = self._delta.load(rows) if isinstance(rows, list) else 0
        self.log.info("exporter %s: deltas go on from what was last sent for %d series", self.component_id, taken)

    def _state_snapshot(self) -> dict[str, Any]:
        """The durable state (``snapshot``). The process starts sent: procfs reads a start a little differently
        each time (a restart may read it a second on), and a series under another start is another series (with
        delta temporality its first delta the whole total). With delta temporality, what was last sent per
        series, so that after a restart each series' first delta runs from it, not from the series' start again
        (a backend summing deltas would count the energy before the restart twice)."""
        section: dict[str, Any] = {
            "process_starts": self._snapshots.starts(),
            "ticks_ns": dict(self._snapshots.ticks_ns),
        }
        if self._delta is not None:
            section["delta_last_sent"] = self._delta.dump()
        return section

    def _warn_unused_tls_files(self) -> None:
        unused = [name for name in ("ca_file", "cert_file", "key_file") if getattr(self.config, name)]
        if unused and not uses_tls(self.config):
            self.log.warning(
                "exporter %s: %s is not used: %s sends in plaintext (%s)",
                self.component_id,
                ", ".join(unused),
                self.config.resolved_endpoint(),
                "insecure: true" if self.config.protocol == "grpc" else "an http:// URL",
            )

    # --- the tick --------------------------------------------------------------------------------

    async def export(self, batch: Batch) -> None:
        self.sender.submit(self.capture(batch))

    # Not named ``snapshot``: that is the component's durable state (above).
    def capture(self, batch: Batch) -> Snapshot:
        """``batch``'s points as the sender needs them, detached from the catalog's shared label mappings."""
        return self._snapshots.take(batch)

    # --- the sender thread -----------------------------------------------------------------------

    def _send(self, snapshot: Snapshot) -> None:
        """One attempt. The request is built anew for each: during an outage the queue holds snapshots, not a
        request per snapshot as well; and delta state moves on only once a request was sent."""
        assert self._sdk is not None
        data, commit = self._encoder.encode(snapshot)
        export_once(self._sdk, data, self.config.timeout)
        commit()


factory = Factory.of(
    OtlpExporter,
    type="otlp",
    kind="exporter",
    config_model=OtlpConfig,
    description="Pushes every metric family (OpenTelemetry names, explicit timestamps) over OTLP gRPC or HTTP.",
    stability="development",
)
