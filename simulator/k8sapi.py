"""The Kubernetes API server's pod endpoints on 127.0.0.1, answering from the scenario.

    api = start_k8s_api(node)                        # http://127.0.0.1:<port>
    api.write_kubeconfig(tmp / "kubeconfig")         # for kubernetes.config.load_kube_config(...)
    v1 = CoreV1Api(new_client_from_config(str(tmp / "kubeconfig")))
    v1.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node.scenario.node.name}")

What a node agent asks of the API server, and nothing else: ``GET /api/v1/pods``,
``/api/v1/namespaces/{ns}/pods`` and ``/api/v1/namespaces/{ns}/pods/{name}``, with ``fieldSelector``,
``labelSelector``, ``limit``/``continue`` and ``watch=true`` (chunked, one JSON event per line). Every pod is
on the scenario's node. Each has name, namespace, uid, labels, QoS class and per container
``containerID: <runtime>://<64 hex>`` (``containerd://``, ``cri-o://``, ``docker://``), the id that
``/proc/<pid>/cgroup`` shows, so PID → container → pod joins hold.

Pods have no lifetimes in the scenario. ``pod_lifetimes="static"`` (the default, and what the kubelet face
assumes) keeps every pod present at all times; ``"processes"`` derives one from the pod's processes (their
effective lifetimes, so a MIG reconfiguration that kills them counts): ADDED at the first start, DELETED
when the last one ends; a pod without processes is static. Each ADDED/DELETED is one resourceVersion, in
scenario-time order, so a watch from any earlier list's resourceVersion replays exactly what happened since.

Faults (``target: k8sapi``) apply per request at the clock's time: ``down`` answers 503 with a Status
(and cuts open watch streams without their final chunk, as a restarting API server does); ``slow``
answers after ``delay_s`` real seconds.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar, Literal
from urllib.parse import parse_qs, urlsplit

import yaml

from wattpipe.simulator._faults import K8sApiFault
from wattpipe.simulator._k8s_objects import (
    BASE_RV,
    BadRequest,
    Event,
    Json,
    Timeline,
    container_id,
    field_selector,
    label_selector,
    pod_key,
    rfc3339,
    status_object,
)
from wattpipe.simulator._loopback import JsonApiHandler, LoopbackHttp
from wattpipe.simulator.node import SimulatedNode
from wattpipe.simulator.scenario import Container, Pod

__all__ = ["K8sApiOptions", "K8sApiServer", "container_id", "start_k8s_api"]

_QOS_CLASS = {"guaranteed": "Guaranteed", "burstable": "Burstable", "besteffort": "BestEffort"}


@dataclass(frozen=True, slots=True)
class K8sApiOptions:
    """How the simulated API server answers."""

    pod_lifetimes: Literal["static", "processes"] = "static"
    # "namespace/name" → the pod's labels (replacing the derived {"app": name without "-<n>"}).
    labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    annotations: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # Watch history kept, in events: a watch from an older resourceVersion gets a 410 Expired ERROR event.
    # None: everything is kept.
    history_events: int | None = None
    # Watches without timeoutSeconds end after this many seconds (the API server's --min-request-timeout).
    default_watch_timeout_s: float = 1800.0
    watch_poll_s: float = 0.02  # real seconds between looks at the clock while a watch is open
    port: int = 0  # 0: an ephemeral port

    def __post_init__(self) -> None:
        if self.pod_lifetimes not in ("static", "processes"):
            raise ValueError(f"pod_lifetimes must be 'static' or 'processes', got {self.pod_lifetimes!r}")
        if self.history_events is not None and self.history_events < 0:
            raise ValueError("history_events must be >= 0 (or None to keep everything)")
        if self.watch_poll_s <= 0 or self.default_watch_timeout_s <= 0:
            raise ValueError("watch_poll_s and default_watch_timeout_s must be positive")


class K8sApiServer:
    """A running API server for ``node``. Stop it with :meth:`close` (or by closing its node)."""

    def __init__(self, node: SimulatedNode, options: K8sApiOptions | None = None) -> None:
        self.node = node
        self.options = options or K8sApiOptions()
        self.requests: Counter[str] = Counter()  # "list", "get", "watch" → requests answered or refused
        self._timeline = Timeline(node, self.options.pod_lifetimes)
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._http = LoopbackHttp(self.options.port, _handler(self), "sim-k8s-api")

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        """Write a kubeconfig (no auth) whose current context is this server; returns the path."""
        name = f"wattpipe-sim-{self.node.scenario.node.name}"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": self.url}}],
            "users": [{"name": name, "user": {}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
            "current-context": name,
            "preferences": {},
        }
        out = Path(path)
        out.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        return out

    def resource_version(self, t_s: float | None = None) -> str:
        """The list resourceVersion at scenario time ``t_s`` (default: now)."""
        return str(BASE_RV + self._timeline.happened(self.node.t_s() if t_s is None else t_s))

    def pod_objects(self, t_s: float | None = None) -> list[Json]:
        """Every pod present at scenario time ``t_s`` (default: now), as the API serves it."""
        count = self._timeline.happened(self.node.t_s() if t_s is None else t_s)
        return [self._pod(event) for event in self._timeline.present(count)]

    def close(self) -> None:
        self._stopping.set()
        self._http.stop(after_close=self._cut_connections)

    def _cut_connections(self) -> None:
        with self._lock:
            connections = list(self._connections)
        for conn in connections:  # idle keep-alive connections would otherwise outlive the server
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> K8sApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- objects -----------------------------------------------------------------------------------

    def _labels(self, pod: Pod) -> dict[str, str]:
        if pod_key(pod) in self.options.labels:
            return dict(self.options.labels[pod_key(pod)])
        return {"app": re.sub(r"-\d+$", "", pod.name)}

    def _fields(self, pod: Pod) -> dict[str, str]:
        # Selection sees the pod as it was while present, so a filtered watch still gets its DELETED.
        node_name = self.node.scenario.node.name
        return {
            "metadata.name": pod.name,
            "metadata.namespace": pod.namespace,
            "spec.nodeName": node_name,
            "status.phase": "Running",
        }

    def _pod(self, added: Event, deleted: Event | None = None) -> Json:
        pod, wall = added.pod, self.node.wall_at
        started = rfc3339(wall(added.t_s))
        metadata: Json = {
            "name": pod.name,
            "namespace": pod.namespace,
            "uid": pod.uid,
            "resourceVersion": str((deleted or added).rv),
            "creationTimestamp": started,
        }
        if labels := self._labels(pod):
            metadata["labels"] = labels
        if annotations := dict(self.options.annotations.get(pod_key(pod), {})):
            metadata["annotations"] = annotations
        if deleted is not None:
            metadata["deletionTimestamp"] = rfc3339(wall(deleted.t_s))
        finished = None if deleted is None else rfc3339(wall(deleted.t_s))
        containers = [_container_spec(pod, container) for container in pod.containers]
        statuses = [_container_status(pod, container, started, finished) for container in pod.containers]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {"nodeName": self.node.scenario.node.name, "restartPolicy": "Always", "containers": containers},
            "status": {
                "phase": "Running" if deleted is None else "Succeeded",
                # Every simulated pod is reachable on loopback (where the simulator's faces listen).
                **({"podIP": "127.0.0.1", "hostIP": "127.0.0.1"} if deleted is None else {}),
                "qosClass": _QOS_CLASS[pod.qos],
                "startTime": started,
                "containerStatuses": statuses,
            },
        }

    def _selected(self, query: Mapping[str, str], namespace: str | None) -> Callable[[Pod], bool]:
        by_fields = field_selector(query.get("fieldSelector", ""))
        by_labels = label_selector(query.get("labelSelector", ""))
        return lambda pod: (
            (namespace is None or pod.namespace == namespace)
            and by_fields(self._fields(pod))
            and by_labels(self._labels(pod))
        )

    def _pod_list(self, query: Mapping[str, str], namespace: str | None) -> Json:
        """A PodList for a list request's query (raises :class:`BadRequest` on a bad selector or token)."""
        selected = self._selected(query, namespace)
        count, start_after = self._timeline.happened(self.node.t_s()), ""
        if token := query.get("continue"):
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
                count, start_after = int(state["rv"]) - BASE_RV, str(state["after"])
            except (ValueError, KeyError, TypeError, binascii.Error):
                raise BadRequest(f"continue key is not valid: {token!r}") from None
        items = [e for e in self._timeline.present(count) if selected(e.pod)]
        items = [e for e in items if pod_key(e.pod) > start_after]
        metadata: Json = {"resourceVersion": str(BASE_RV + count)}
        try:
            limit = int(query.get("limit") or 0)
        except ValueError:
            raise BadRequest(f"limit must be an integer, got {query['limit']!r}") from None
        if 0 < limit < len(items):
            state = {"rv": BASE_RV + count, "after": pod_key(items[limit - 1].pod)}
            metadata["continue"] = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
            metadata["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": [self._pod(e) for e in items]}

    def _find_pod(self, namespace: str, name: str) -> Json | None:
        for event in self._timeline.present(self._timeline.happened(self.node.t_s())):
            if event.pod.namespace == namespace and event.pod.name == name:
                return self._pod(event)
        return None

    def _fault(self) -> K8sApiFault | None:
        fault = self.node.service_fault("k8sapi", self.node.t_s())
        return fault if isinstance(fault, K8sApiFault) else None


def _image(pod: Pod, container: Container) -> str:
    return f"registry.sim.local/{pod.namespace}/{container.name}:v1"


def _container_spec(pod: Pod, container: Container) -> Json:
    """A container's entry in the pod's ``spec.containers``: its image and its device limits."""
    spec: Json = {"name": container.name, "image": _image(pod, container)}
    limits = Counter(device.resource for device in container.devices)
    if limits:
        amounts = {resource: str(count) for resource, count in limits.items()}
        spec["resources"] = {"limits": amounts, "requests": dict(amounts)}
    return spec


def _container_status(pod: Pod, container: Container, started: str, finished: str | None) -> Json:
    """A container's entry in ``status.containerStatuses``: running, or (``finished``) terminated."""
    image = _image(pod, container)
    state: Json = {"running": {"startedAt": started}}
    if finished is not None:
        state = {
            "terminated": {
                "exitCode": 0,
                "reason": "Completed",
                "startedAt": started,
                "finishedAt": finished,
                "containerID": container_id(container),
            }
        }
    digest = hashlib.sha256(image.encode()).hexdigest()
    return {
        "name": container.name,
        "containerID": container_id(container),
        "image": image,
        "imageID": f"registry.sim.local/{pod.namespace}/{container.name}@sha256:{digest}",
        "ready": finished is None,
        "started": finished is None,
        "restartCount": 0,
        "state": state,
    }


def _handler(api: K8sApiServer) -> type[BaseHTTPRequestHandler]:
    """The request handler class for ``api`` (http.server makes one instance per connection)."""
    return type("Handler", (_Handler,), {"api": api})


class _Handler(JsonApiHandler):
    """The API server's pod endpoints; ``api`` is set on the subclass :func:`_handler` makes."""

    api: ClassVar[K8sApiServer]

    def setup(self) -> None:
        super().setup()
        # Go servers set TCP_NODELAY; without it, headers and body in two writes wait on delayed ACKs.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.api._lock:
            self.api._connections.add(self.connection)

    def finish(self) -> None:
        with self.api._lock:
            self.api._connections.discard(self.connection)
        super().finish()

    def do_GET(self) -> None:
        api = self.api
        url = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(url.query, keep_blank_values=True).items()}
        parts = url.path.strip("/").split("/")
        watch = query.get("watch", "").lower() in ("true", "1")
        if parts[:3] == ["api", "v1", "pods"] and len(parts) == 3:
            namespace, name = None, None
        elif parts[:3] == ["api", "v1", "namespaces"] and len(parts) in (5, 6) and parts[4] == "pods":
            namespace, name = parts[3], (parts[5] if len(parts) == 6 else None)
        else:
            self._json(404, status_object(404, "NotFound", "the server could not find the requested resource"))
            return
        with api._lock:
            api.requests["watch" if watch and name is None else "list" if name is None else "get"] += 1
        fault = api._fault()
        if fault is not None and fault.kind == "down":
            self._json(503, status_object(503, "ServiceUnavailable", "the API server is down (simulated)"))
            return
        if fault is not None and fault.kind == "slow":
            api._stopping.wait(fault.delay_s)  # network latency in real seconds; close() cuts it short
        try:
            if name is not None:
                pod = api._find_pod(parts[3], name)
                if pod is None:
                    status = status_object(404, "NotFound", f'pods "{name}" not found')
                    status["details"] = {"name": name, "kind": "pods"}
                    self._json(404, status)
                else:
                    self._json(200, pod)
            elif watch:
                self._watch(query, api._selected(query, namespace))
            else:
                self._json(200, api._pod_list(query, namespace))
        except BadRequest as err:
            self._json(400, status_object(400, "BadRequest", str(err)))

    def _watch(self, query: Mapping[str, str], selected: Callable[[Pod], bool]) -> None:
        api = self.api
        timeline, options = api._timeline, api.options
        try:
            timeout_s = float(query.get("timeoutSeconds") or options.default_watch_timeout_s)
            since = query.get("resourceVersion", "")
            from_count = int(since) - BASE_RV if since not in ("", "0") else None
        except ValueError:
            raise BadRequest(f"resourceVersion and timeoutSeconds must be numbers: {query}") from None
        self._start_watch()
        end_t_s, end_real_s = api.node.t_s() + timeout_s, time.monotonic() + timeout_s
        sent = timeline.happened(api.node.t_s())
        if from_count is None:  # "most recent": synthetic ADDED for the current state, then changes
            initial = [e for e in timeline.present(sent) if selected(e.pod)]
            if not all(self._event("ADDED", api._pod(e)) for e in initial):
                return
        elif options.history_events is not None and from_count < sent - options.history_events:
            message = f"too old resource version: {since} ({BASE_RV + sent - options.history_events})"
            self._event("ERROR", status_object(410, "Expired", message))
            self._end()
            return
        else:
            sent = max(0, from_count)
        live = {id(e.pod): e for e in timeline.events if e.type == "ADDED"}
        while True:
            t_s = api.node.t_s()
            fault = api._fault()
            if api._stopping.is_set() or (fault is not None and fault.kind == "down"):
                self.close_connection = True  # no final chunk: the client sees the stream break
                return
            upto = timeline.happened(min(t_s, end_t_s))
            for event in timeline.events[sent:upto]:
                if selected(event.pod):
                    added = live[id(event.pod)]
                    obj = api._pod(event) if event.type == "ADDED" else api._pod(added, event)
                    if not self._event(event.type, obj):
                        return
            sent = max(sent, upto)
            if t_s >= end_t_s or time.monotonic() >= end_real_s:
                if query.get("allowWatchBookmarks", "").lower() in ("true", "1"):
                    rv = {"resourceVersion": str(BASE_RV + sent)}
                    self._event("BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": rv})
                self._end()
                return
            api._stopping.wait(options.watch_poll_s)


def start_k8s_api(node: SimulatedNode, options: K8sApiOptions | None = None) -> K8sApiServer:
    """Start an API server for ``node`` on 127.0.0.1; it stops when the node closes."""
    server = K8sApiServer(node, options)
    node.on_close(server.close)
    return server
