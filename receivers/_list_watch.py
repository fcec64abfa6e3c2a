"""Keep an in-memory store of Kubernetes objects current (the k8s_cluster and dra receivers): one thread per
kind that lists once, then watches from the list's resourceVersion; on any failure (the stream breaks,
410 Expired, the API is down) it lists again after a backoff. Lists and watches, never polled lists: the
API server does the work once per change. Objects stay plain JSON dicts (no client models)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

__all__ = ["Store", "Watcher", "stop_all", "wait_synced"]


class Store(Protocol):
    def replace(self, kind: str, items: list[Mapping[str, Any]]) -> None: ...

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None: ...


log = logging.getLogger(__name__)


class Watcher:
    """A background list + watch of ``kind`` into ``state`` until :meth:`stop`."""

    def __init__(
        self,
        kind: str,
        list_call: Callable[..., Any],
        state: Store,
        *,
        watch_timeout_s: float,
        backoff_s: float,
        warn: Callable[[str, str], None],
        on_error: Callable[[Exception], bool] | None = None,
        list_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """``on_error``: asked first about each failure; True means it was handled (no warning)."""
        self.kind = kind
        self.list_call = list_call
        self.state = state
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.warn = warn
        self.on_error = on_error
        self.list_kwargs = dict(list_kwargs or {})  # e.g. a field selector, for the list and the watch
        self.failures = 0
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, name=f"k8s-cluster-{kind}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            try:
                answer = self.list_call(**self.list_kwargs, _preload_content=False, _request_timeout=30)
                listed = json.loads(answer.data)
                self.state.replace(self.kind, listed.get("items") or [])
                version = listed["metadata"]["resourceVersion"]
                while not self._stop.is_set():
                    # "object": events stay JSON dicts (no client models, whose names vary by API version).
                    self._watch = watch.Watch(return_type="object")  # type: ignore[no-untyped-call]
                    for event in self._watch.stream(
                        self.list_call,
                        **self.list_kwargs,
                        resource_version=version,
                        timeout_seconds=int(self.watch_timeout_s),
                    ):
                        raw = event.get("raw_object") or {}
                        if event.get("type") == "ERROR":
                            raise RuntimeError(f"watch error: {raw.get('message', raw)}")
                        self.state.apply(self.kind, str(event.get("type")), raw)
                        version = (raw.get("metadata") or {}).get("resourceVersion", version)
                    self.failures = 0
            except Exception as exc:  # any failure: list again later (the receiver reports it meanwhile)
                if self._stop.is_set():
                    return
                self.failures += 1
                if self.on_error is None or not self.on_error(exc):
                    self.warn(self.kind, f"{self.kind} list/watch failed ({type(exc).__name__}: {exc}); listing again")
                self._stop.wait(self.backoff_s)


async def wait_synced(
    synced: set[str], kinds: set[str], timeout_s: float, give_up: Callable[[], bool] = lambda: False
) -> None:
    """Until every kind has been listed once, ``give_up()`` is true, or ``timeout_s`` (real time) passed."""
    deadline = time.monotonic() + timeout_s
    # Filled by the watch threads: polled (an asyncio.Event would need the loop handed to every thread).
    while True:
        if kinds <= synced or give_up() or time.monotonic() >= deadline:
            return
        await asyncio.sleep(0.02)


async def stop_all(watchers: list[Watcher]) -> None:
    """Stop every watcher at once, off the event loop: each waits up to 2 s for a watch stream blocked on
    its read, and one after another on the loop those waits would add up and stall the pipeline."""
    await asyncio.gather(*(asyncio.to_thread(w.stop) for w in watchers))
