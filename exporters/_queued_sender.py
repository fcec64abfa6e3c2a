"""A bounded queue with a background sender: what the OpenTelemetry Collector's exporterhelper gives every
exporter (``sending_queue`` + ``retry_on_failure`` + ``timeout``), for any exporter here that pushes.

The pipeline's tick only ever calls :meth:`QueuedSender.submit`, which never blocks on the network: a full
queue drops its *oldest* request (the newest carries the latest totals). One thread sends, in order, with
exponential backoff until a request succeeds or ``max_elapsed_s`` passes; :meth:`QueuedSender.shutdown`
flushes within ``shutdown_timeout_s`` and drops the rest. Every request dropped is counted, in records, in
``wattpipe_exporter_dropped_total``, every failed attempt in ``wattpipe_exporter_failed_total``; what to log
about it is the :class:`SendEvents` given (see ``_send_log.py``).

Timing here is real monotonic time, never the pipeline's clock: retries are network timing, and the
pipeline's clock may be stepped (tests, ``simulate``) while the network is not.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from wattpipe.pipeline.telemetry import ComponentTelemetry

__all__ = ["GiveUpReason", "QueueSettings", "QueuedSender", "Request", "SendEvents", "SendFailed"]

GiveUpReason = Literal["max_elapsed", "shutdown"]
"""Why a request was given up: ``max_elapsed_s`` passed since its first attempt, or shutdown's deadline did."""


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """The Collector's queue and retry settings, in seconds."""

    queue_size: int
    """Requests waiting for the sender; the oldest is dropped when a new one finds the queue full."""
    initial_interval_s: float
    max_interval_s: float
    max_elapsed_s: float
    """Since a request's first failed attempt: then it is given up (and counted as dropped)."""
    shutdown_timeout_s: float
    """How long shutdown spends sending what is queued before dropping the rest."""
    attempt_timeout_s: float
    """The longest one attempt may take: shutdown waits this much past its own timeout for the one in flight."""
    multiplier: float = 1.5
    """The Collector's backoff multiplier. Its randomization (jitter) is left out: one sender per exporter per
    node, and deterministic waits keep outage tests exact."""

    def next_interval(self, interval_s: float) -> float:
        return min(interval_s * self.multiplier, self.max_interval_s)


class Request(Protocol):
    """What the queue holds: anything that says which pipeline it came from and how many records it carries
    (drops and failures are counted in records, like every exporter count)."""

    @property
    def pipeline(self) -> str: ...

    @property
    def records(self) -> int: ...


class SendFailed(Exception):
    """Raised by a send function to say why an attempt failed (the text becomes the log's detail). Any other
    exception fails the attempt too, described by its type and message."""


class SendEvents(Protocol):
    """What the sender reports, for logging: each episode (an outage, a full queue) has a start and an end, so
    an implementation can log it once instead of once per attempt or per tick."""

    def queue_full(self) -> None:
        """The queue has just overflowed (its oldest request dropped) after being short of full. Any thread."""

    def queue_drained(self, batches: int, records: int) -> None:
        """The sender caught up after overflows that dropped ``batches`` requests. Sender thread."""

    def failed(self, request: Request, detail: str) -> None:
        """An attempt failed. Sender thread, as are the rest."""

    def retrying(self, wait_s: float) -> None: ...

    def sent(self) -> None:
        """An attempt succeeded."""

    def gave_up(self, request: Request, reason: GiveUpReason) -> None: ...

    def shutdown_dropped(self, batches: int, records: int) -> None:
        """Shutdown's deadline passed with ``batches`` requests not tried again; all of them dropped."""


R = TypeVar("R", bound=Request)


class QueuedSender(Generic[R]):
    """``submit`` from the pipeline, ``send`` (one attempt; raise to fail it) on a thread of its own."""

    def __init__(
        self,
        name: str,
        send: Callable[[R], object],
        settings: QueueSettings,
        telemetry: ComponentTelemetry,
        events: SendEvents,
    ) -> None:
        self.name = name
        self.settings = settings
        self._send_once = send
        self._telemetry = telemetry
        self._events = events
        self._queue: collections.deque[R] = collections.deque()
        self._cond = threading.Condition()
        # Under _cond: set by shutdown, read by the sender between attempts and while it backs off.
        self._stopping = False
        self._deadline = float("inf")  # time.monotonic() by which shutdown gives up
        self._overflow: tuple[int, int] | None = None  # (batches, records) dropped since the queue last filled
        self._thread: threading.Thread | None = None
        self._ended = threading.Event()  # the sender thread has returned
        self._finished: Callable[[], object] | None = None  # and tells shutdown's waiter so

    # --- the pipeline's side ---------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Started and not (yet completely) shut down."""
        return self._thread is not None

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    def submit(self, request: R) -> None:
        """Queue ``request``, dropping (and counting) the oldest one if the queue is full. Never blocks on
        the sender: it holds the lock only between attempts and while waiting."""
        first = False
        with self._cond:
            if len(self._queue) >= self.settings.queue_size:
                dropped = self._queue.popleft()
                self._telemetry.dropped(dropped.pipeline, dropped.records)
                first = self._overflow is None
                batches, records = self._overflow or (0, 0)
                self._overflow = (batches + 1, records + dropped.records)
            self._queue.append(request)
            self._cond.notify_all()
        if first:
            self._events.queue_full()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping = False
        self._deadline = float("inf")
        self._ended.clear()
        self._finished = None
        self._thread = threading.Thread(target=self._run_then_tell, name=self.name, daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        """Send what is queued until ``shutdown_timeout_s`` passes, then drop (and count) the rest."""
        thread = self._thread
        if thread is None:
            return
        settings = self.settings
        with self._cond:
            self._stopping = True
            self._deadline = time.monotonic() + settings.shutdown_timeout_s
            self._cond.notify_all()
        # An attempt in flight at the deadline may run for up to one attempt timeout more. Waited for on the
        # event loop, not by a pool thread blocked in join(): when the service's own shutdown budget runs out
        # it cancels this wait and the process exits at once (the sender is a daemon thread), instead of the
        # interpreter's exit waiting on a pool thread that is still joining.
        loop = asyncio.get_running_loop()
        finished = asyncio.Event()
        self._finished = lambda: loop.call_soon_threadsafe(finished.set)
        # The thread sets _ended before it reads _finished: either it calls us, or we see it ended.
        if not self._ended.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), settings.shutdown_timeout_s + settings.attempt_timeout_s)
        if self._ended.is_set():
            thread.join()  # it has returned from its work: only its last lines are left to run
        self._thread = None

    def wait_ended(self, timeout_s: float) -> bool:
        """Wait for the sender thread to return (after a shutdown that was cut short, say)."""
        return self._ended.wait(timeout_s)

    # --- the sender thread -----------------------------------------------------------------------

    def _run_then_tell(self) -> None:
        try:
            self._run()
        finally:
            self._ended.set()
            finished = self._finished
            if finished is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    finished()

    def _next(self) -> tuple[R | None, bool]:
        """The next request (None: stopping and nothing left), and whether shutdown's deadline has passed."""
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if not self._queue:
                return None, False
            request = self._queue.popleft()
            late = self._stopping and time.monotonic() >= self._deadline
            overflow = self._overflow if not self._queue else None
            if overflow is not None:
                self._overflow = None  # caught up: a later overflow is news again
        if overflow is not None:
            self._events.queue_drained(*overflow)
        return request, late

    def _run(self) -> None:
        late_batches = late_records = 0
        while True:
            request, late = self._next()
            if request is None:
                break
            if late:  # shutdown's time is up: what is left is dropped without another attempt
                self._telemetry.dropped(request.pipeline, request.records)
                late_batches, late_records = late_batches + 1, late_records + request.records
            elif not self._send(request):
                self._telemetry.dropped(request.pipeline, request.records)
        if late_batches:
            self._events.shutdown_dropped(late_batches, late_records)

    def _send(self, request: R) -> bool:
        """Attempt with backoff until it succeeds, ``max_elapsed_s`` passes, or shutdown's deadline does."""
        give_up = time.monotonic() + self.settings.max_elapsed_s
        interval_s = self.settings.initial_interval_s
        while True:
            detail = self._attempt(request)
            if detail is None:
                self._events.sent()
                return True
            failed = self._telemetry.telemetry.exporter_failed
            failed.labels(pipeline=request.pipeline, component=self._telemetry.component).inc(request.records)
            self._events.failed(request, detail)
            reason = self._back_off(interval_s, give_up)
            if reason is not None:
                self._events.gave_up(request, reason)
                return False
            interval_s = self.settings.next_interval(interval_s)

    def _attempt(self, request: R) -> str | None:
        """One attempt: None if it succeeded, else why not. Whatever the send function raises fails only the
        attempt: the sender thread must outlive every bug and outage, or the queue would fill for good."""
        try:
            self._send_once(request)
        except SendFailed as exc:
            return str(exc)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def _back_off(self, interval_s: float, give_up: float) -> GiveUpReason | None:
        """Wait ``interval_s`` before the next attempt; or say why the request is to be given up instead.

        New requests notify the condition too: they must not cut the wait short. Shutdown does, once, so that
        what is queued gets one more attempt right away; later waits end at shutdown's deadline.
        """
        with self._cond:
            stopping = self._stopping
            now = time.monotonic()
            if now >= min(give_up, self._deadline):
                return "shutdown" if stopping and now >= self._deadline else "max_elapsed"
            until = min(now + interval_s, give_up, self._deadline)
            self._events.retrying(until - now)
            while (now := time.monotonic()) < until and self._stopping == stopping:
                self._cond.wait(until - now)
            return None
