"""``wattpipe extender``: a kube-scheduler HTTP extender that ranks nodes by their GPU topology (issue 19).

The scheduler POSTs ``ExtenderArgs`` (``pod``, and ``nodes`` — a NodeList — or ``nodenames`` when the
extender is ``nodeCacheCapable``) to ``<urlPrefix>/filter`` and ``<urlPrefix>/prioritize``; the answers are
``ExtenderFilterResult`` (``nodes``/``nodenames``, ``failedNodes``, ``error``) and ``HostPriorityList``
(``[{"host", "score"}]``, 0–10). The field names are those of ``k8s.io/kube-scheduler/extender/v1``.

Each node's topology and free GPUs come from the ``wattpipe.io/gpu-topology`` annotation the agent writes
(:mod:`pipeline.topology_annotation`); the pod's request is the sum of its containers' ``nvidia.com/gpu``
limits (or an init container's, if larger). ``filter`` fails the annotated nodes with fewer free GPUs than
requested (as ``failedNodes``: preempting pods can resolve it) and passes the others: a node without the
annotation is unknown, not empty, and the scheduler's own resource fit still judges it. ``prioritize`` scores
the best free set of the requested size with :func:`pipeline.topology.best_set`, the agent's own function,
and normalises across the candidates (:func:`pipeline.topology.normalise`): 1–10 for nodes that fit, 0 for
unknown ones; a pod that asks for no GPU gets 0 everywhere (no opinion).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TextIO

from wattpipe.pipeline.errors import ConfigError
from wattpipe.pipeline.topology import TopologyError, best_set, normalise
from wattpipe.pipeline.topology_annotation import ANNOTATION, NodeTopology, decode
from wattpipe.pipeline.webconfig import WebConfig, load_web_config, serve
from wattpipe.steps import EXIT_CONFIG, EXIT_OK

__all__ = ["ExtenderError", "add_parser", "filter_nodes", "gpu_request", "make_app", "prioritize"]

log = logging.getLogger("wattpipe.extender")

RESOURCE = "nvidia.com/gpu"
MAX_BODY_BYTES = 64 << 20  # a NodeList of a few thousand nodes
NodeLookup = Callable[[Sequence[str]], Mapping[str, Mapping[str, str] | None]]
"""Node names → each node's annotations (None: no such node), for ``nodenames`` requests."""


class ExtenderError(ValueError):
    """A request the extender cannot read; the message names the field."""


def _quantity(value: object, where: str) -> int:
    text = str(value).strip()
    if not text.isdigit():
        raise ExtenderError(f"{where}: {value!r} is not a whole number of devices")
    return int(text)


def gpu_request(pod: Mapping[str, Any], resource: str = RESOURCE) -> int:
    """The pod's ``resource`` count: its containers' sum, or its largest init container's if larger."""
    spec = pod.get("spec") or {}

    def each(kind: str) -> list[int]:
        counts = []
        for index, container in enumerate(spec.get(kind) or []):
            resources = container.get("resources") or {}
            value = (resources.get("limits") or {}).get(resource, (resources.get("requests") or {}).get(resource))
            counts.append(0 if value is None else _quantity(value, f"pod.spec.{kind}[{index}] {resource}"))
        return counts

    return max(sum(each("containers")), max(each("initContainers"), default=0))


def _annotations(node: Mapping[str, Any]) -> tuple[str, Mapping[str, str]]:
    metadata = node.get("metadata") or {}
    name = metadata.get("name")
    if not isinstance(name, str):
        raise ExtenderError("nodes.items[]: a node without metadata.name")
    return name, metadata.get("annotations") or {}


def _topology(name: str, annotations: Mapping[str, str] | None) -> NodeTopology | None:
    text = (annotations or {}).get(ANNOTATION)
    if text is None:
        return None
    try:
        return decode(text, where=f"node {name} annotation {ANNOTATION}")
    except TopologyError as exc:
        log.warning("%s: treated as unknown", exc)
        return None


def _candidates(args: Mapping[str, Any], lookup: NodeLookup | None) -> dict[str, NodeTopology | None]:
    nodes = args.get("nodes")
    if isinstance(nodes, Mapping):
        found = dict(_annotations(node) for node in nodes.get("items") or [])
        return {name: _topology(name, annotations) for name, annotations in found.items()}
    names = args.get("nodenames")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ExtenderError("ExtenderArgs needs 'nodes' (a NodeList) or 'nodenames' (a list of names)")
    if lookup is None:
        log.warning(
            "the scheduler sent node names only (its extender config has nodeCacheCapable: true) but this extender "
            "runs without --node-cache: no node's annotation can be read, none is scored; run it with --node-cache"
        )
        return dict.fromkeys(names)
    looked_up = lookup(names)
    return {name: _topology(name, looked_up.get(name)) for name in names}


def _pod(args: Mapping[str, Any]) -> Mapping[str, Any]:
    pod = args.get("pod")
    if not isinstance(pod, Mapping):
        raise ExtenderError("ExtenderArgs needs 'pod'")
    return pod


def filter_nodes(args: Mapping[str, Any], lookup: NodeLookup | None = None, resource: str = RESOURCE) -> dict[str, Any]:
    """ExtenderArgs → ExtenderFilterResult."""
    request = gpu_request(_pod(args), resource)
    candidates = _candidates(args, lookup)
    failed: dict[str, str] = {}
    for name, node in candidates.items():
        if request and node is not None and len(node.free) < request:
            failed[name] = f"wattpipe: {request} {resource} requested, {len(node.free)} free ({ANNOTATION})"
    if isinstance(args.get("nodes"), Mapping):
        items = [n for n in args["nodes"].get("items") or [] if _annotations(n)[0] not in failed]
        return {"nodes": {**args["nodes"], "items": items}, "failedNodes": failed, "error": ""}
    return {"nodenames": [n for n in candidates if n not in failed], "failedNodes": failed, "error": ""}


def prioritize(
    args: Mapping[str, Any], lookup: NodeLookup | None = None, resource: str = RESOURCE
) -> list[dict[str, Any]]:
    """ExtenderArgs → HostPriorityList."""
    request = gpu_request(_pod(args), resource)
    candidates = _candidates(args, lookup)
    if not request:
        return [{"host": name, "score": 0} for name in candidates]
    raw: dict[str, int | None] = {}
    for name, node in candidates.items():
        found = None if node is None else best_set(node.topology, node.free, request)
        raw[name] = None if found is None else found.score
    scores = normalise(raw)
    return [{"host": name, "score": scores[name]} for name in candidates]


def _answer(start_response: Callable[..., Any], status: str, body: object) -> Iterable[bytes]:
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def make_app(
    prefix: str = "", lookup: NodeLookup | None = None, resource: str = RESOURCE
) -> Callable[..., Iterable[bytes]]:
    """The WSGI app: POST ``<prefix>/filter`` and ``<prefix>/prioritize``, GET ``/healthz``."""
    verbs: dict[str, Callable[..., object]] = {f"{prefix}/filter": filter_nodes, f"{prefix}/prioritize": prioritize}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
        if path == "/healthz" and method == "GET":
            return _answer(start_response, "200 OK", {"status": "ok"})
        verb = verbs.get(path)
        if verb is None or method != "POST":
            return _answer(start_response, "404 Not Found", {"error": f"{method} {path}: POST {' or '.join(verbs)}"})
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if length > MAX_BODY_BYTES:
            return _answer(start_response, "413 Content Too Large", {"error": f"body over {MAX_BODY_BYTES} bytes"})
        try:
            args = json.loads(environ["wsgi.input"].read(length) or b"null")
            if not isinstance(args, dict):
                raise ExtenderError("the body must be an ExtenderArgs JSON object")
            return _answer(start_response, "200 OK", verb(args, lookup, resource))
        except (json.JSONDecodeError, ExtenderError, TopologyError) as exc:
            log.warning("%s: bad request: %s", path, exc)
            return _answer(start_response, "400 Bad Request", {"error": f"{path}: {exc}"})

    return app


def _kubernetes_lookup() -> NodeLookup:
    from kubernetes import client

    from wattpipe.pipeline.kube import api_client

    api = api_client(os.environ)
    if api is None:
        raise ConfigError(["extender: no Kubernetes API to look nodes up in (not in a pod and no KUBECONFIG)"])
    core = client.CoreV1Api(api)

    def lookup(names: Sequence[str]) -> Mapping[str, Mapping[str, str] | None]:
        wanted = set(names)
        found: dict[str, Mapping[str, str]] = {}
        for node in core.list_node().items:
            meta = node.metadata
            if meta is not None and meta.name in wanted:
                found[meta.name] = meta.annotations or {}
        return {name: found.get(name) for name in names}

    return lookup


def cmd_extender(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        web: WebConfig | None = load_web_config(args.web_config) if args.web_config else None
        lookup = _kubernetes_lookup() if args.node_cache else None
        server = serve(args.listen, make_app(args.prefix, lookup, args.resource), web)
    except ConfigError as exc:
        print("\n".join(f"error: {e}" for e in exc.messages), file=err)
        return EXIT_CONFIG
    except (OSError, ValueError) as exc:
        print(f"error: extender: cannot listen on {args.listen}: {exc}", file=err)
        return EXIT_CONFIG
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    print(f"wattpipe extender: {server.url}{args.prefix}/filter and /prioritize", file=out, flush=True)
    stop.wait()
    server.close()
    return EXIT_OK


def add_parser(sub: Any) -> None:
    sp = sub.add_parser("extender", help="a kube-scheduler HTTP extender ranking nodes by GPU topology")
    sp.add_argument("--listen", default="0.0.0.0:8890", help="host:port (default 0.0.0.0:8890)")
    sp.add_argument("--prefix", default="", help="path before /filter and /prioritize (the urlPrefix's path)")
    sp.add_argument("--web-config", default=None, help="TLS and basic auth (Prometheus exporter-toolkit format)")
    sp.add_argument("--resource", default=RESOURCE, help=f"the extended resource to score (default {RESOURCE})")
    sp.add_argument(
        "--node-cache",
        action="store_true",
        help="the scheduler sends node names only (nodeCacheCapable: true): read annotations from the API server",
    )
    sp.set_defaults(fn=cmd_extender)
