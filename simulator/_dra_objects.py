"""DRA objects (resource.k8s.io/v1) as the API server shows them: ResourceSlices and ResourceClaims.

A slice lists its devices with the ``uuid`` attribute NVIDIA's DRA driver publishes (v1 shape:
``attributes: {uuid: {string: …}}``). A claim is ADDED unallocated at 0 and MODIFIED at ``allocated_s`` with
``status.allocation.devices.results[] = {request, driver, pool, device}`` and ``status.reservedFor[]`` =
the pod, as the scheduler and the kubelet leave it.
"""

from __future__ import annotations

from wattpipe.simulator._k8s_objects import Json
from wattpipe.simulator.scenario import ClusterPod, DraClaim, DraSlice

__all__ = ["claim_object", "pod_claims", "pod_uid", "slice_object"]


def pod_uid(namespace: str, name: str) -> str:
    return f"cluster-{namespace}-{name}"


def slice_object(item: DraSlice, rv: int) -> Json:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": item.name, "resourceVersion": str(rv)},
        "spec": {
            "driver": item.driver,
            "nodeName": item.node,
            "pool": {"name": item.pool or item.node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": d.name, "attributes": {"uuid": {"string": d.uuid}}} for d in item.devices],
        },
    }


def claim_object(item: DraClaim, rv: int, allocated: bool) -> Json:
    obj: Json = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": item.name,
            "namespace": item.namespace,
            "uid": f"claim-{item.namespace}-{item.name}",
            "resourceVersion": str(rv),
        },
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {},
    }
    if allocated:
        results = []
        for ref in item.devices:
            pool, _, device = ref.rpartition("/")
            results.append({"request": "gpu", "driver": item.driver, "pool": pool, "device": device})
        obj["status"] = {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [
                {"resource": "pods", "name": pod, "uid": pod_uid(item.namespace, pod)}
                for pod in [item.pod, *item.shared_with]
            ],
        }
    return obj


def pod_claims(pod: ClusterPod, spec: Json) -> None:
    """Put the pod's claims in its spec: ``resourceClaims`` and the first container's ``resources.claims``."""
    if not pod.claims:
        return
    spec["resourceClaims"] = [{"name": f"claim{i}", "resourceClaimName": c} for i, c in enumerate(pod.claims)]
    spec["containers"][0]["resources"]["claims"] = [{"name": f"claim{i}"} for i in range(len(pod.claims))]
