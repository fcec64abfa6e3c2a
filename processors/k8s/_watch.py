"""The thread that keeps the pod cache: list this node's pods, then watch them, for as long as it runs.

Only pods with ``spec.nodeName=<node>`` are ever asked for: one node's pods, never the cluster's. The
loop is the usual informer's, small:

1. list (paged), replace the cache, remember the list's resourceVersion;
2. watch from it, applying ADDED / MODIFIED / DELETED, following BOOKMARKs; when the server ends the
   watch (``timeoutSeconds``), watch again from the last resourceVersion seen;
3. a 410 Gone (history compacted past our version) → list again at once; any other failure (API server
   down, connection cut, timeout) → wait (from 1 s, doubling up to ``backoff_max``), then list again.

Both requests are made with the client's ``_preload_content=False`` and their JSON read here: the same
dicts from a list and a watch, no model objects, and the open watch response is ours, so ``stop()`` can
shut its socket down and interrupt a read that would otherwise wait for the next event. (The client's
own ``Watch.stop`` could not: it only does that in recent versions, and not before its first read.)

Blocking (the kubernetes client is synchronous), hence a thread. A list in flight when ``stop()`` comes
finishes within ``request_timeout`` first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from wattpipe.pipeline.kube import api_client
from wattpipe.pipeline.telemetry import RateLimitedLog
from wattpipe.processors.k8s._cache import PodCache, PodInfo

if TYPE_CHECKING:  # the kubernetes client costs ~20 MB to import: only when it is used
    from kubernetes import client

__all__ = ["PodWatcher", "api_client"]

_PAGE = 500
_GONE = 410


class _Gone(Exception):
    """The watch's resourceVersion is too old: only a new list can go on."""


class _WatchError(Exception):
    """An ERROR event other than 410 (the Status it carries)."""


def _lines(response: Any) -> Iterator[bytes]:
    """The newline-separated JSON events of a watch response, as they arrive."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from (line for line in complete if line.strip())
    if pending.strip():
        yield pending


def _interrupt(response: Any) -> None:
    """Unblock a thread reading ``response``: shut its socket down (closing alone would not wake the read)."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class PodWatcher:
    """Lists and watches the pods of ``node`` into ``cache`` on a daemon thread."""

    def __init__(
        self,
        api: client.ApiClient,
        node: str,
        cache: PodCache,
        make_pod: Callable[[Mapping[str, Any]], PodInfo | None],
        *,
        monotonic: Callable[[], float],
        log: RateLimitedLog,
        component_id: str,
        request_timeout_s: float,
        watch_timeout_s: float,
        backoff_max_s: float,
    ) -> None:
        from kubernetes import client

        self.api = api
        self.v1 = client.CoreV1Api(api)
        self.node = node
        self.cache = cache
        self.make_pod = make_pod
        self.monotonic = monotonic
        self.log = log
        self.component_id = component_id
        self.request_timeout_s = request_timeout_s
        self.watch_timeout_s = watch_timeout_s
        self.backoff_max_s = backoff_max_s
        self.lists = 0  # successful lists
        self.failures = 0  # failures in a row
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._response: Any = None  # the open watch, for stop() to interrupt
        self._thread = threading.Thread(target=self._run, name=f"wattpipe-{component_id}-pods", daemon=True)

    @property
    def selector(self) -> str:
        return f"spec.nodeName={self.node}"

    def start(self) -> None:
        self._thread.start()

    def stop(self, join_s: float = 2.0) -> bool:
        """Stop the thread; returns whether it ended within ``join_s`` (it is a daemon thread either way)."""
        with self._lock:
            self._stopping.set()
            if self._response is not None:
                _interrupt(self._response)
        if self._thread.is_alive():
            self._thread.join(join_s)
        ended = not self._thread.is_alive()
        if ended:
            self.api.close()  # type: ignore[no-untyped-call]
        return ended

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # --- the loop ------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff_s = 0.0
        while not self._stopping.is_set():
            try:
                version = self._list()
                if self.failures:
                    self._warn("recovered", f"listing pods on node {self.node} works again")
                self.failures, backoff_s = 0, 0.0
                while not self._stopping.is_set():
                    version = self._watch_once(version)
            except _Gone:
                continue  # list again at once: nothing is wrong but our version's age
            except Exception as exc:  # API errors, connection errors (urllib3's, OSError), bad answers
                if self._stopping.is_set():
                    break
                self.failures += 1
                backoff_s = min(self.backoff_max_s, backoff_s * 2 or 1.0)
                self._warn("failed", f"{self._describe(exc)}; the pod cache is kept, retrying in {backoff_s:g}s")
                self._stopping.wait(backoff_s)

    def _list(self) -> str:
        pods: list[PodInfo] = []
        token: str | None = None
        while True:
            # Not preloaded, the client returns urllib3's response, whatever its annotations say.
            response: Any = self.v1.list_pod_for_all_namespaces(
                field_selector=self.selector,
                limit=_PAGE,
                _continue=token,
                _preload_content=False,
                _request_timeout=self.request_timeout_s,
            )
            try:
                answer = json.loads(response.data)
            finally:
                response.release_conn()
            pods.extend(p for p in map(self.make_pod, answer.get("items") or ()) if p is not None)
            metadata = answer.get("metadata") or {}
            token = metadata.get("continue")
            if not token:
                break
        self.cache.replace(pods, self.monotonic())
        self.lists += 1
        if self.lists == 1:
            self.log.log(
                logging.INFO,
                "synced",
                f"processor {self.component_id}: pod cache synced: {len(pods)} pod(s) on node {self.node}",
            )
        return str(metadata.get("resourceVersion") or "")

    def _watch_once(self, version: str) -> str:
        """One watch request from ``version``; returns the version to go on from."""
        response: Any = self.v1.list_pod_for_all_namespaces(
            field_selector=self.selector,
            resource_version=version,
            allow_watch_bookmarks=True,
            watch=True,
            timeout_seconds=max(1, round(self.watch_timeout_s)),
            _preload_content=False,
            # A read timeout past the server's own end of the watch: a connection that died without a FIN
            # (the node's network lost) is noticed instead of waited on for ever.
            _request_timeout=(self.request_timeout_s, self.watch_timeout_s + self.request_timeout_s),
        )
        with self._lock:
            if self._stopping.is_set():
                response.release_conn()
                return version
            self._response = response
        try:
            for line in _lines(response):
                version = self._apply(json.loads(line)) or version
        finally:
            with self._lock:
                self._response = None
            response.release_conn()
        return version

    def _apply(self, event: Mapping[str, Any]) -> str | None:
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, Mapping):
            return None
        if kind == "ERROR":
            if obj.get("code") == _GONE:
                raise _Gone(obj.get("message"))
            raise _WatchError(f"watch error {obj.get('code')} {obj.get('reason')}: {obj.get('message')}")
        metadata = obj.get("metadata") or {}
        if kind in ("ADDED", "MODIFIED"):
            pod = self.make_pod(obj)
            if pod is not None:
                self.cache.upsert(pod)
        elif kind == "DELETED" and metadata.get("uid"):
            self.cache.delete(str(metadata["uid"]), self.monotonic())
        version = metadata.get("resourceVersion")
        return str(version) if version else None

    # --- logging -------------------------------------------------------------------------------

    def _describe(self, exc: Exception) -> str:
        from kubernetes import client

        what = f"listing or watching pods on node {self.node} failed"
        if isinstance(exc, client.ApiException):
            return f"{what}: HTTP {exc.status} {exc.reason}"
        return f"{what}: {type(exc).__name__}: {exc}"

    def _warn(self, key: str, message: str) -> None:
        self.log.log(logging.WARNING, key, f"processor {self.component_id}: {message}")
