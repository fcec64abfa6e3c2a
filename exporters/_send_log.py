"""What a queued sender's trouble logs: each episode once when it begins and once when it ends, never per
attempt or per tick.

During an outage a sender fails an attempt every few seconds and a full queue drops a batch every tick: a
line for each would bury everything else in the log. The counts are in ``wattpipe_exporter_failed_total``
and ``wattpipe_exporter_dropped_total``; the log says when an episode began, why, and what it cost once it
ended. Per-attempt detail goes to DEBUG.
"""

from __future__ import annotations

import logging
import time

from wattpipe.exporters._queued_sender import GiveUpReason, QueueSettings, Request
from wattpipe.pipeline.telemetry import ComponentTelemetry

__all__ = ["SendLog"]


class SendLog:
    """:class:`~exporters._queued_sender.SendEvents` as log lines, for the exporter ``component_id`` sending
    to ``destination``. Its outage state belongs to the sender thread, which alone reports attempts."""

    def __init__(
        self,
        component_id: str,
        destination: str,
        settings: QueueSettings,
        telemetry: ComponentTelemetry,
        logger: logging.Logger,
        after_give_up: str = "",
    ) -> None:
        self.component_id = component_id
        self.destination = destination
        self.settings = settings
        self.after_give_up = after_give_up
        """Said when a request is given up: what the exporter's data do about it (cumulative totals, say)."""
        # Rate-limited per key as well: a second outage within the period is not news again.
        self._once = telemetry.log
        self._log = logger
        self._failing_since: float | None = None  # time.monotonic() of the outage's first failure
        self._failures = 0  # failed attempts in this outage
        self._given_up = (0, 0)  # (batches, records) given up in this outage

    def queue_full(self) -> None:
        self._once.log(
            logging.WARNING,
            f"{self.component_id}/queue-full",
            f"exporter {self.component_id}: queue full ({self.settings.queue_size} batches): dropping the oldest "
            "batch for each new one until the sender catches up (counted in wattpipe_exporter_dropped_total)",
        )

    def queue_drained(self, batches: int, records: int) -> None:
        self._once.log(
            logging.INFO,
            f"{self.component_id}/queue-drained",
            f"exporter {self.component_id}: the queue has drained; {batches} batches ({records} records) were "
            "dropped while it was full",
        )

    def failed(self, request: Request, detail: str) -> None:
        self._failures += 1
        if self._failing_since is not None:
            self._log.debug("exporter %s: attempt %d failed: %s", self.component_id, self._failures, detail)
            return
        self._failing_since = time.monotonic()
        self._once.log(
            logging.WARNING,
            f"{self.component_id}/failing",
            f"exporter {self.component_id}: cannot send to {self.destination}: {detail}; retrying with backoff "
            f"and queueing up to {self.settings.queue_size} batches (failed attempts are counted in "
            "wattpipe_exporter_failed_total; logged again when sending works)",
        )

    def retrying(self, wait_s: float) -> None:
        self._log.debug("exporter %s: retrying in %.2f s", self.component_id, wait_s)

    def sent(self) -> None:
        if self._failing_since is None:
            return
        elapsed = time.monotonic() - self._failing_since
        batches, records = self._given_up
        lost = f"; {batches} batches ({records} records) were given up meanwhile" if batches else ""
        self._once.log(
            logging.INFO,
            f"{self.component_id}/recovered",
            f"exporter {self.component_id}: sending to {self.destination} again, after {self._failures} failed "
            f"attempts over {elapsed:.1f} s{lost}",
        )
        self._failing_since, self._failures, self._given_up = None, 0, (0, 0)

    def gave_up(self, request: Request, reason: GiveUpReason) -> None:
        batches, records = self._given_up
        self._given_up = (batches + 1, records + request.records)
        why = (
            f"shutdown_timeout ({self.settings.shutdown_timeout_s:g} s) passed"
            if reason == "shutdown"
            else f"retry_max_elapsed_time ({self.settings.max_elapsed_s:g} s) passed"
        )
        if batches:  # the outage's first give-up was logged; the rest are counted, and summed up at recovery
            self._log.debug("exporter %s: gave up a batch of %d records: %s", self.component_id, request.records, why)
            return
        note = f"; {self.after_give_up}" if self.after_give_up else ""
        self._once.log(
            logging.ERROR,
            f"{self.component_id}/gave-up",
            f"exporter {self.component_id}: gave up a batch of {request.records} records: {why} (batches given up "
            f"are counted in wattpipe_exporter_dropped_total{note})",
        )

    def shutdown_dropped(self, batches: int, records: int) -> None:
        self._log.warning(
            "exporter %s: shutdown_timeout (%g s) passed: dropped %d unsent batches (%d records)",
            self.component_id,
            self.settings.shutdown_timeout_s,
            batches,
            records,
        )
