"""The queued sender (exporters/_queued_sender.py): bounded queue, background sender, the Collector's backoff,
counted drops, a flush with a deadline. No network: the send function is a script of outcomes.

Retry timing is real time (the sender's, by design): intervals here are tens of milliseconds, and the tests
wait on conditions, not fixed sleeps, except where the point is that nothing happens for a while.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.helpers.otlp_receiver import wait_until
from wattpipe.exporters._queued_sender import GiveUpReason, QueuedSender, QueueSettings, Request, SendFailed
from wattpipe.exporters._send_log import SendLog
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.telemetry import ComponentTelemetry, Telemetry

LOGGER = logging.getLogger("wattpipe.exporter.queued")


@dataclass(frozen=True)
class Req:
    n: int
    records: int = 2
    pipeline: str = "metrics"


@dataclass
class Events:
    """Every event the sender reports, in order (a SendEvents that remembers)."""

    seen: list[tuple[Any, ...]] = field(default_factory=list)

    def queue_full(self) -> None:
        self.seen.append(("queue_full",))

    def queue_drained(self, batches: int, records: int) -> None:
        self.seen.append(("queue_drained", batches, records))

    def failed(self, request: Request, detail: str) -> None:
        self.seen.append(("failed", request, detail))

    def retrying(self, wait_s: float) -> None:
        self.seen.append(("retrying", wait_s))

    def sent(self) -> None:
        self.seen.append(("sent",))

    def gave_up(self, request: Request, reason: GiveUpReason) -> None:
        self.seen.append(("gave_up", request, reason))

    def shutdown_dropped(self, batches: int, records: int) -> None:
        self.seen.append(("shutdown_dropped", batches, records))

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [e for e in self.seen if e[0] == name]


class Endpoint:
    """The send function: records each attempt; fails while ``down`` (or raises ``error`` if set)."""

    def __init__(self) -> None:
        self.down = False
        self.error: Exception | None = None
        self.sent: list[int] = []
        self.attempts: list[tuple[int, float]] = []  # (request, time.monotonic())
        self.lock = threading.Lock()

    def __call__(self, request: Req) -> None:
        with self.lock:
            self.attempts.append((request.n, time.monotonic()))
            if self.error is not None:
                raise self.error
            if self.down:
                raise SendFailed("collector down")
            self.sent.append(request.n)


SETTINGS = QueueSettings(
    queue_size=3,
    initial_interval_s=0.02,
    max_interval_s=0.05,
    max_elapsed_s=5.0,
    shutdown_timeout_s=1.0,
    attempt_timeout_s=0.5,
)


def make(endpoint: Endpoint, events: Any = None, **settings: Any) -> tuple[QueuedSender[Req], ComponentTelemetry]:
    telemetry = Telemetry(SteppedClock()).for_component("exporter", "queued", LOGGER)
    options = {**{name: getattr(SETTINGS, name) for name in SETTINGS.__slots__}, **settings}
    sender = QueuedSender[Req]("test-sender", endpoint, QueueSettings(**options), telemetry, events or Events())
    return sender, telemetry


def counted(telemetry: ComponentTelemetry, name: str) -> float:
    labels = {"pipeline": "metrics", "component": "queued"}
    return telemetry.registry.get_sample_value(f"wattpipe_exporter_{name}_total", labels) or 0.0


def running(sender: QueuedSender[Req], body: Callable[[], object]) -> None:
    """Start ``sender``, run ``body`` on a thread (it may block), then shut the sender down."""

    async def go() -> None:
        sender.start()
        await asyncio.to_thread(body)
        await sender.shutdown()

    asyncio.run(go())


# --- the queue ------------------------------------------------------------------------------------


def test_a_full_queue_drops_the_oldest_request_and_counts_its_records() -> None:
    endpoint, events = Endpoint(), Events()
    sender, telemetry = make(endpoint, events)
    for n in range(5):  # not started: nothing leaves the queue
        sender.submit(Req(n, records=n + 1))
    assert sender.queued == 3
    assert counted(telemetry, "dropped") == 1 + 2  # requests 0 and 1
    assert events.named("queue_full") == [("queue_full",)]  # once for the episode, not per drop
    running(sender, lambda: None)
    assert endpoint.sent == [2, 3, 4]
    # Caught up: the episode ends with what it cost (reported when the sender takes the last queued request).
    assert events.named("queue_drained") == [("queue_drained", 2, 3)]


def test_an_overflow_after_the_queue_drained_is_a_new_episode() -> None:
    endpoint, events = Endpoint(), Events()
    sender, _ = make(endpoint, events, queue_size=1)
    sender.submit(Req(0))
    sender.submit(Req(1))
    running(sender, lambda: wait_until(lambda: endpoint.sent == [1], 5.0, "the queue to drain"))
    sender.submit(Req(2))
    sender.submit(Req(3))
    assert events.named("queue_full") == [("queue_full",), ("queue_full",)]


# --- sending and retrying -------------------------------------------------------------------------


def test_requests_are_sent_in_order_and_nothing_is_counted_as_lost() -> None:
    endpoint = Endpoint()
    sender, telemetry = make(endpoint, queue_size=100)

    def body() -> None:
        for n in range(20):
            sender.submit(Req(n))
        wait_until(lambda: len(endpoint.sent) == 20, 5.0, "twenty requests")

    running(sender, body)
    assert endpoint.sent == list(range(20))
    assert (counted(telemetry, "dropped"), counted(telemetry, "failed")) == (0.0, 0.0)


def test_backoff_grows_by_the_multiplier_up_to_the_max_interval() -> None:
    endpoint, events = Endpoint(), Events()
    endpoint.down = True
    sender, telemetry = make(endpoint, events)

    def body() -> None:
        sender.submit(Req(0))
        wait_until(lambda: len(endpoint.attempts) >= 6, 5.0, "six attempts")
        endpoint.down = False
        wait_until(lambda: endpoint.sent == [0], 5.0, "the request to be sent")

    running(sender, body)
    waits = [e[1] for e in events.named("retrying")][:5]
    assert waits == pytest.approx([0.02, 0.03, 0.045, 0.05, 0.05])  # ×1.5, capped at max_interval_s
    attempts = [t for _, t in endpoint.attempts]
    assert all(b - a >= w for a, b, w in zip(attempts, attempts[1:], waits, strict=False))  # never early
    failures = len(endpoint.attempts) - 1
    assert counted(telemetry, "failed") == 2 * failures  # every failed attempt, in records
    assert counted(telemetry, "dropped") == 0
    assert events.named("failed")[0] == ("failed", Req(0), "collector down")
    assert events.seen[-1] == ("sent",)


def test_a_request_is_given_up_after_max_elapsed_and_counted_as_dropped() -> None:
    endpoint, events = Endpoint(), Events()
    endpoint.down = True
    sender, telemetry = make(endpoint, events, max_elapsed_s=0.1)

    def body() -> None:
        sender.submit(Req(0, records=7))
        wait_until(lambda: counted(telemetry, "dropped") == 7, 5.0, "the request to be given up")

    running(sender, body)
    assert events.named("gave_up") == [("gave_up", Req(0, records=7), "max_elapsed")]
    assert endpoint.sent == []


def test_an_exception_fails_only_the_attempt_and_says_what_it_was() -> None:
    endpoint, events = Endpoint(), Events()
    endpoint.error = KeyError("hw.energy")
    sender, _ = make(endpoint, events)

    def body() -> None:
        sender.submit(Req(0))
        wait_until(lambda: len(endpoint.attempts) >= 2, 5.0, "a retry after the exception")
        endpoint.error = None
        wait_until(lambda: endpoint.sent == [0], 5.0, "the request to be sent")

    running(sender, body)
    assert events.named("failed")[0] == ("failed", Req(0), "KeyError: 'hw.energy'")


def test_new_requests_do_not_cut_a_backoff_short() -> None:
    endpoint = Endpoint()
    endpoint.down = True
    sender, _ = make(endpoint, initial_interval_s=2.0, max_interval_s=2.0, queue_size=10, shutdown_timeout_s=0.1)

    def body() -> None:
        sender.submit(Req(0))
        wait_until(lambda: len(endpoint.attempts) == 1, 5.0, "the first attempt")
        for n in range(1, 6):
            time.sleep(0.03)
            sender.submit(Req(n))
        assert len(endpoint.attempts) == 1  # still waiting out the first backoff

    running(sender, body)


# --- shutdown -------------------------------------------------------------------------------------


def test_shutdown_flushes_what_is_queued() -> None:
    endpoint = Endpoint()
    sender, telemetry = make(endpoint, queue_size=50)
    for n in range(50):
        sender.submit(Req(n))
    began = time.monotonic()
    running(sender, lambda: None)
    assert endpoint.sent == list(range(50))
    assert time.monotonic() - began < SETTINGS.shutdown_timeout_s
    assert counted(telemetry, "dropped") == 0
    assert not sender.running
    assert sender.wait_ended(0)


def test_shutdown_gives_the_queue_one_more_try_then_drops_the_rest_at_its_deadline() -> None:
    endpoint, events = Endpoint(), Events()
    endpoint.down = True
    sender, telemetry = make(endpoint, events, initial_interval_s=10.0, max_interval_s=10.0, shutdown_timeout_s=0.2)

    async def go() -> None:
        sender.start()
        for n in range(3):
            sender.submit(Req(n))
        await asyncio.to_thread(wait_until, lambda: len(endpoint.attempts) == 1, 5.0, "the first attempt")
        began = time.monotonic()
        await sender.shutdown()  # cuts the 10 s backoff short: one more attempt, then the deadline
        assert time.monotonic() - began < 0.2 + 0.3

    asyncio.run(go())
    assert [n for n, _ in endpoint.attempts[:2]] == [0, 0]
    assert events.named("gave_up") == [("gave_up", Req(0), "shutdown")]
    assert events.named("shutdown_dropped") == [("shutdown_dropped", 2, 4)]  # requests 1 and 2, not tried
    assert counted(telemetry, "dropped") == 3 * 2


def test_a_shutdown_cancelled_by_the_service_returns_at_once_and_the_thread_ends_later() -> None:
    endpoint = Endpoint()
    endpoint.down = True
    sender, _ = make(endpoint, shutdown_timeout_s=5.0)

    async def go() -> None:
        sender.start()
        sender.submit(Req(0))
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sender.shutdown(), timeout=0.1)
        assert time.monotonic() - began < 0.5

    asyncio.run(go())
    endpoint.down = False
    assert sender.wait_ended(5.0)
    assert endpoint.sent == [0]


def test_the_sender_can_start_again_after_shutdown() -> None:
    endpoint = Endpoint()
    sender, _ = make(endpoint)
    running(sender, lambda: sender.submit(Req(0)))
    running(sender, lambda: sender.submit(Req(1)))
    assert endpoint.sent == [0, 1]


# --- the log of an outage -------------------------------------------------------------------------


def test_send_log_logs_an_outage_once_and_sums_it_up_at_recovery(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, LOGGER.name)
    endpoint = Endpoint()
    endpoint.down = True
    telemetry = Telemetry(SteppedClock()).for_component("exporter", "queued", LOGGER)
    settings = QueueSettings(**{**{n: getattr(SETTINGS, n) for n in SETTINGS.__slots__}, "max_elapsed_s": 0.03})
    log = SendLog("queued", "collector:4317", settings, telemetry, LOGGER, after_give_up="nothing is lost")
    sender = QueuedSender[Req]("test-sender", endpoint, settings, telemetry, log)

    def body() -> None:
        sender.submit(Req(0))
        sender.submit(Req(1))
        wait_until(lambda: counted(telemetry, "dropped") == 4, 5.0, "both requests given up")
        endpoint.down = False
        sender.submit(Req(2))
        wait_until(lambda: endpoint.sent == [2], 5.0, "the request to be sent")

    running(sender, body)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert [level for level, _ in lines] == [logging.WARNING, logging.ERROR, logging.INFO]
    assert lines[0][1].startswith("exporter queued: cannot send to collector:4317: collector down; retrying")
    assert lines[1][1] == (
        "exporter queued: gave up a batch of 2 records: retry_max_elapsed_time (0.03 s) passed (batches given up "
        "are counted in wattpipe_exporter_dropped_total; nothing is lost)"
    )
    failures = len(endpoint.attempts) - 1
    assert lines[2][1].startswith(f"exporter queued: sending to collector:4317 again, after {failures} failed")
    assert lines[2][1].endswith("; 2 batches (4 records) were given up meanwhile")
