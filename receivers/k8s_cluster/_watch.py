"""Keep a :class:`ClusterState` current: one thread per kind (pods, nodes) that lists once, then watches from
the list's resourceVersion; on any failure (the stream breaks, 410 Expired, the API is down) it lists again
after a backoff. Lists and watches, never polled lists: the API server does the work once per change."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from wattpipe.receivers.k8s_cluster._state import ClusterState

__all__ = ["Watcher"]

log = logging.getLogger(__name__)


class Watcher:
    """A background list + watch of ``kind`` into ``state`` until :meth:`stop`."""

    def __init__(
        self,
        kind: str,
        list_call: Callable[..., Any],
        state: ClusterState,
        *,
        watch_timeout_s: float,
        backoff_s: float,
        warn: Callable[[str, str], None],
    ) -> None:
        self.kind = kind
        self.list_call = list_call
        self.state = state
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.warn = warn
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
                answer = self.list_call(_preload_content=False, _request_timeout=30)
                listed = json.loads(answer.data)
                self.state.replace(self.kind, listed.get("items") or [])
                version = listed["metadata"]["resourceVersion"]
                while not self._stop.is_set():
                    self._watch = watch.Watch()  # type: ignore[no-untyped-call]
                    for event in self._watch.stream(
                        self.list_call, resource_version=version, timeout_seconds=int(self.watch_timeout_s)
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
                self.warn(self.kind, f"{self.kind} list/watch failed ({type(exc).__name__}: {exc}); listing again")
                self._stop.wait(self.backoff_s)
