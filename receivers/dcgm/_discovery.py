"""Where dcgm-exporter listens, when the config does not say: the exporter pod on this node, else localhost.

The GPU Operator runs dcgm-exporter as a DaemonSet (label ``app=nvidia-dcgm-exporter``, port 9400), so
on a Kubernetes node the answer is "the pod with that label whose ``spec.nodeName`` is ours". This asks
the API server exactly that (one list call, filtered server-side by node and label) with the
``kubernetes`` client: in-cluster credentials when running in a pod, else the kubeconfig ``KUBECONFIG``
names. Without ``NODE_NAME`` or API access, or with no matching pod, it is ``localhost:9400``: a
hostNetwork exporter, or one beside the agent.

Blocking (the kubernetes client is synchronous): run it on a worker thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wattpipe.pipeline.kube import api_client as _api_client

if TYPE_CHECKING:  # the kubernetes client costs ~20 MB to import: only when it is used
    from kubernetes.client import V1Pod

__all__ = ["Discovery", "choose_pod", "discover"]


@dataclass(frozen=True, slots=True)
class Discovery:
    """An endpoint to scrape, and how it was found (for the log)."""

    endpoint: str
    found: bool  # False: the localhost fallback
    how: str


def _url(scheme: str, host: str, port: int) -> str:
    if ":" in host:  # an IPv6 pod IP
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}/metrics"


def choose_pod(pods: Sequence[V1Pod]) -> tuple[str, str] | str:
    """(namespace/name, IP) of the running pod with an IP (the first by name if several), or why none."""
    ready = sorted(
        (_name(p), p.status.pod_ip)
        for p in pods
        if p.status is not None and p.status.phase == "Running" and p.status.pod_ip
    )
    if ready:
        return ready[0]
    if not pods:
        return "no pod matches"
    names = ", ".join(sorted(_name(p) for p in pods))
    return f"matching pod(s) {names} are not Running with an IP yet"


def _name(pod: V1Pod) -> str:
    meta = pod.metadata
    return f"{meta.namespace}/{meta.name}" if meta is not None else "?"


def discover(
    env: Mapping[str, str], *, label_selector: str, port: int, scheme: str = "http", timeout_s: float = 2.0
) -> Discovery:
    """Find the endpoint (never raises: every failure ends at the localhost fallback, with a reason)."""
    from kubernetes import client

    fallback = _url(scheme, "localhost", port)

    def fall_back(why: str) -> Discovery:
        return Discovery(fallback, False, f"{why}; using {fallback}")

    node = env.get("NODE_NAME", "")
    if not node:
        return fall_back("NODE_NAME is not set, so the exporter pod on this node cannot be looked up")
    try:
        api = _api_client(env)
    except Exception as exc:  # a broken kubeconfig raises anything from ConfigException to yaml errors
        return fall_back(f"no Kubernetes API access ({type(exc).__name__}: {exc})")
    if api is None:
        return fall_back("no Kubernetes API access (not in a pod, and KUBECONFIG is not set)")
    where = f"pods with label {label_selector!r} on node {node}"
    try:
        with api:
            pods = (
                client.CoreV1Api(api)
                .list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={node}", label_selector=label_selector, _request_timeout=timeout_s
                )
                .items
            )
    except client.ApiException as exc:
        return fall_back(f"listing {where} failed: HTTP {exc.status} {exc.reason}")
    except Exception as exc:  # connection errors arrive as urllib3's, OSError, or the client's own
        return fall_back(f"listing {where} failed: {type(exc).__name__}: {exc}")
    chosen = choose_pod(pods)
    if isinstance(chosen, str):
        return fall_back(f"{where}: {chosen}")
    name, ip = chosen
    return Discovery(_url(scheme, ip, port), True, f"dcgm-exporter pod {name} on node {node}")
