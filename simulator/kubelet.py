"""The kubelet's pod-resources gRPC API (v1) on a unix socket, answering from the scenario.

    with KubeletServer(node) as kubelet:            # unix://<temp dir>/kubelet.sock
        channel = grpc.insecure_channel(kubelet.endpoint)
        PodResourcesListerStub(channel).List(ListPodResourcesRequest())

What it answers, and where that follows the real kubelet and the NVIDIA device plugin:

- ``List``: every pod of the scenario with every container (pods have no lifetimes in the scenario, so all
  are active at all times), each container's devices as one ``ContainerDevices`` per device id and NUMA
  node, which is the shape current kubelets send (``group_devices=True`` gives the older shape: one entry
  per resource with all its ids). ``cpu_ids`` and ``memory`` stay empty: the CPU and memory managers'
  default ``none`` policies assign nothing exclusively. Allocations made at admission are kept when a
  ``target: gpu`` fault later re-partitions MIG, as the kubelet's checkpoint keeps them.
- Device ids as the device plugin names them: ``GPU-<uuid>`` (whole GPU), ``MIG-<uuid>`` (MIG, R470+
  drivers) or ``MIG-GPU-<uuid>/<gi>/<ci>`` (``device_id_form="mig-legacy"``, older drivers; ci is 0 as
  the GPU Operator creates one compute instance per GPU instance), with ``::<replica>`` appended for a
  time-sliced replica. Resource names are the scenario's (``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``,
  ``nvidia.com/gpu.shared`` …). The NUMA node is the GPU's ``topology.numa`` (negative: no topology).
- ``GetAllocatableResources``: every device the plugin advertises at the current scenario time: each
  non-MIG GPU, each MIG instance of the current layout, and for a time-sliced device as many replicas as
  the scenario hands out (highest ``replica`` + 1).
- ``Get`` of a pod that does not exist fails like the kubelet's: status UNKNOWN (it returns a plain Go
  error, not a gRPC status) with the message ``pod <name> in namespace <namespace> not found``.
  ``get_not_found_code=grpc.StatusCode.NOT_FOUND`` answers what a stricter server would.

Faults (``target: kubelet``) follow scenario time. ``down`` removes the socket and stops the server, as a
stopped kubelet does; when the fault ends a new server binds a new socket at the same path, as a restarted
kubelet does (clients must redial). The socket follows the clock whenever :meth:`KubeletServer.refresh`
runs: at start, and every ``poll_interval_s`` real seconds from a background thread (``None``: no
thread). With a stepped clock no real time need pass, so call ``refresh()`` after ``clock.advance`` to
apply the change at once; until then, a call that reaches the still-bound server after the fault began
is answered UNAVAILABLE, as an unreachable kubelet would be. ``slow`` answers after ``delay_s`` real
seconds.

The kubelet rate-limits this API (``KUBELET_RATE_LIMIT``: 100 requests/s, burst 10) and answers
RESOURCE_EXHAUSTED beyond; ``rate_limit=KUBELET_RATE_LIMIT`` turns that on, with tokens refilled on the
node's clock (a stepped clock refills only when advanced). Off by default.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Iterable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc

from wattpipe.pipeline.proto.podresources.v1 import api_pb2, api_pb2_grpc
from wattpipe.simulator._faults import KubeletFault
from wattpipe.simulator.fake_nvml import mig_uuid
from wattpipe.simulator.node import SimulatedNode
from wattpipe.simulator.scenario import Container, DeviceRef, Pod, Scenario

__all__ = ["KUBELET_RATE_LIMIT", "DeviceIdForm", "KubeletServer", "RateLimit", "device_id", "start_kubelet"]

DeviceIdForm = Literal["mig", "mig-legacy"]
"""How MIG devices are named: ``MIG-<uuid>`` (R470+ drivers) or ``MIG-GPU-<uuid>/<gi>/<ci>`` (older)."""

SOCKET_NAME = "kubelet.sock"
_MAX_UNIX_PATH_BYTES = 107  # sun_path is 108 bytes with the terminating NUL


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A token bucket: ``qps`` tokens per second of node-clock time, at most ``burst`` saved."""

    qps: float
    burst: int

    def __post_init__(self) -> None:
        if self.qps <= 0 or self.burst < 1:
            raise ValueError(f"rate limit needs qps > 0 and burst >= 1, got {self.qps}, {self.burst}")


KUBELET_RATE_LIMIT = RateLimit(qps=100.0, burst=10)


def device_id(scenario: Scenario, ref: DeviceRef, form: DeviceIdForm = "mig") -> str:
    """The id the NVIDIA device plugin gives the device ``ref`` allocates."""
    gpu_uuid = scenario.gpus[ref.gpu].uuid
    if ref.gi is None:
        base = gpu_uuid
    elif form == "mig":
        base = mig_uuid(gpu_uuid, ref.gi)
    else:
        base = f"MIG-{gpu_uuid}/{ref.gi}/0"
    return base if ref.replica is None else f"{base}::{ref.replica}"


class KubeletServer:
    """A kubelet pod-resources endpoint for ``node``. Stopped when the node closes.

    ``socket_dir`` None: a fresh temporary directory, removed on :meth:`stop` (a short path, as unix
    socket paths are limited to 107 bytes).
    """

    def __init__(
        self,
        node: SimulatedNode,
        socket_dir: str | Path | None = None,
        device_id_form: DeviceIdForm = "mig",
        *,
        group_devices: bool = False,
        rate_limit: RateLimit | None = None,
        get_not_found_code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
        poll_interval_s: float | None = 0.05,
    ) -> None:
        if device_id_form not in ("mig", "mig-legacy"):
            raise ValueError(f"device_id_form must be 'mig' or 'mig-legacy', got {device_id_form!r}")
        if poll_interval_s is not None and poll_interval_s <= 0:
            raise ValueError("poll_interval_s must be positive (or None for no polling)")
        self.node = node
        self.device_id_form: DeviceIdForm = device_id_form
        self.group_devices = group_devices
        self.rate_limit = rate_limit
        self.get_not_found_code = get_not_found_code
        self.poll_interval_s = poll_interval_s
        self._owns_dir = socket_dir is None
        self._dir = Path(tempfile.mkdtemp(prefix="wattpipe-kubelet-")) if socket_dir is None else Path(socket_dir)
        self.socket_path = self._dir.resolve() / SOCKET_NAME
        if len(str(self.socket_path).encode()) > _MAX_UNIX_PATH_BYTES:
            self._remove_dir()
            raise ValueError(f"unix socket path {self.socket_path} is longer than {_MAX_UNIX_PATH_BYTES} bytes")
        self.requests: Counter[str] = Counter()  # method name → calls answered or refused
        self._lock = threading.RLock()
        self._started = False
        self._server: Any = None  # grpc.Server while the socket is up
        self._executor: futures.ThreadPoolExecutor | None = None
        self._stopping = threading.Event()
        self._poller: threading.Thread | None = None
        self._tokens = float(rate_limit.burst) if rate_limit else 0.0
        self._tokens_at_s = node.clock.monotonic()
        self._servicer = _Servicer(self)
        node.on_close(self.stop)

    @property
    def endpoint(self) -> str:
        """The gRPC target: ``unix:///<dir>/kubelet.sock``."""
        return f"unix://{self.socket_path}"

    @property
    def serving(self) -> bool:
        """Whether the socket is up (started and not in a ``down`` fault as of the last refresh)."""
        return self._server is not None

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> KubeletServer:
        """Bind the socket (unless a ``down`` fault is active) and start polling the clock."""
        with self._lock:
            if self._started:
                return self
            self._dir.mkdir(parents=True, exist_ok=True)
            self._started = True
            self._stopping.clear()
            self.refresh()
            if self.poll_interval_s is not None:
                self._poller = threading.Thread(target=self._poll, name="sim-kubelet-poll", daemon=True)
                self._poller.start()
        return self

    def stop(self) -> None:
        """Stop answering and remove the socket (and the directory, if it is ours). Idempotent."""
        with self._lock:
            if not self._started:
                return
            self._started = False
            self._stopping.set()
            self._unbind()
            poller, self._poller = self._poller, None
        if poller is not None:
            poller.join(timeout=5)
        self._remove_dir()

    def refresh(self) -> bool:
        """Bring the socket in line with the scenario's ``down`` faults at the current time.

        Returns whether the socket is up afterwards.
        """
        with self._lock:
            if not self._started:
                return False
            fault = self._fault()
            down = fault is not None and fault.kind == "down"
            if down and self._server is not None:
                self._unbind()
            elif not down and self._server is None:
                self._bind()
            return self._server is not None

    def __enter__(self) -> KubeletServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _bind(self) -> None:
        self.socket_path.unlink(missing_ok=True)  # a stale socket from a crashed run blocks bind()
        executor = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="sim-kubelet")
        server = grpc.server(executor)
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self._servicer, server)
        server.add_insecure_port(f"unix:{self.socket_path}")
        server.start()
        self._server, self._executor = server, executor

    def _unbind(self) -> None:
        server, executor = self._server, self._executor
        self._server, self._executor = None, None
        if server is not None:
            server.stop(grace=None).wait(timeout=5)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        self.socket_path.unlink(missing_ok=True)

    def _remove_dir(self) -> None:
        if self._owns_dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _poll(self) -> None:
        assert self.poll_interval_s is not None
        while not self._stopping.wait(self.poll_interval_s):
            self.refresh()

    def _fault(self) -> KubeletFault | None:
        fault = self.node.service_fault("kubelet", self.node.t_s())
        return fault if isinstance(fault, KubeletFault) else None

    # --- answers -----------------------------------------------------------------------------------

    def pod_resources(self) -> list[api_pb2.PodResources]:
        """What ``List`` answers now: every pod with its containers' devices."""
        return [self._pod_message(pod) for pod in self.node.scenario.pods]

    def find_pod(self, namespace: str, name: str) -> api_pb2.PodResources | None:
        """What ``Get`` answers for ``namespace/name``, or None for a pod that does not exist."""
        for pod in self.node.scenario.pods:
            if pod.namespace == namespace and pod.name == name:
                return self._pod_message(pod)
        return None

    def allocatable_devices(self) -> list[api_pb2.ContainerDevices]:
        """What ``GetAllocatableResources`` lists as devices at the current scenario time."""
        scenario = self.node.scenario
        t_s = self.node.t_s()
        allocated: dict[tuple[int, int | None], list[DeviceRef]] = {}
        for pod in scenario.pods:
            for container in pod.containers:
                for ref in container.devices:
                    allocated.setdefault((ref.gpu, ref.gi), []).append(ref)
        advertised: list[DeviceRef] = []
        for index in range(len(scenario.gpus)):
            mig = scenario.mig_at(index, t_s)
            slots: list[tuple[int | None, str]] = (
                [(None, "nvidia.com/gpu")]
                if mig is None
                else [(inst.gi, f"nvidia.com/mig-{inst.profile}") for inst in sorted(mig.instances, key=lambda i: i.gi)]
            )
            for gi, default_resource in slots:
                refs = allocated.get((index, gi), [])
                resource = refs[0].resource if refs else default_resource
                replicas = [ref.replica for ref in refs if ref.replica is not None]
                if not replicas:
                    advertised.append(DeviceRef(resource=resource, gpu=index, gi=gi))
                    continue
                advertised += [
                    DeviceRef(resource=resource, gpu=index, gi=gi, replica=n) for n in range(max(replicas) + 1)
                ]
        return self._devices_message(advertised)

    def _pod_message(self, pod: Pod) -> api_pb2.PodResources:
        return api_pb2.PodResources(
            name=pod.name,
            namespace=pod.namespace,
            containers=[self._container_message(container) for container in pod.containers],
        )

    def _container_message(self, container: Container) -> api_pb2.ContainerResources:
        return api_pb2.ContainerResources(name=container.name, devices=self._devices_message(container.devices))

    def _devices_message(self, refs: Iterable[DeviceRef]) -> list[api_pb2.ContainerDevices]:
        scenario = self.node.scenario
        if not self.group_devices:
            return [
                api_pb2.ContainerDevices(
                    resource_name=ref.resource,
                    device_ids=[device_id(scenario, ref, self.device_id_form)],
                    topology=_topology([scenario.gpus[ref.gpu].topology.numa]),
                )
                for ref in refs
            ]
        grouped: dict[str, tuple[list[str], list[int]]] = {}
        for ref in refs:
            ids, numa = grouped.setdefault(ref.resource, ([], []))
            ids.append(device_id(scenario, ref, self.device_id_form))
            if scenario.gpus[ref.gpu].topology.numa not in numa:
                numa.append(scenario.gpus[ref.gpu].topology.numa)
        return [
            api_pb2.ContainerDevices(resource_name=resource, device_ids=ids, topology=_topology(sorted(numa)))
            for resource, (ids, numa) in grouped.items()
        ]

    # --- admission of one call ---------------------------------------------------------------------

    def admit(self, method: str, context: Any) -> None:
        """Count the call and apply faults and the rate limit; aborts the call (raises) when refused."""
        with self._lock:
            self.requests[method] += 1
            fault = self._fault()
            down = fault is not None and fault.kind == "down"
            limited = not down and not self._take_token()
        if down:
            # The old server got the call after the fault began: answer as an unreachable peer would,
            # and let the poller (or the next refresh) take the socket away.
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is down (simulated)")
        if limited:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
        if fault is not None and fault.kind == "slow":
            self._stopping.wait(fault.delay_s)  # network latency in real seconds; stop() cuts it short

    def _take_token(self) -> bool:
        limit = self.rate_limit
        if limit is None:
            return True
        now_s = self.node.clock.monotonic()
        self._tokens = min(float(limit.burst), self._tokens + (now_s - self._tokens_at_s) * limit.qps)
        self._tokens_at_s = now_s
        if self._tokens < 1.0 - 1e-9:  # clock differences round: 0.01 s × 100/s must make one token
            return False
        self._tokens -= 1.0
        return True


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: KubeletServer) -> None:
        self._kubelet = kubelet

    def List(self, request: api_pb2.ListPodResourcesRequest, context: Any) -> api_pb2.ListPodResourcesResponse:
        self._kubelet.admit("List", context)
        return api_pb2.ListPodResourcesResponse(pod_resources=self._kubelet.pod_resources())

    def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: Any
    ) -> api_pb2.AllocatableResourcesResponse:
        self._kubelet.admit("GetAllocatableResources", context)
        return api_pb2.AllocatableResourcesResponse(devices=self._kubelet.allocatable_devices())

    def Get(self, request: api_pb2.GetPodResourcesRequest, context: Any) -> api_pb2.GetPodResourcesResponse:
        self._kubelet.admit("Get", context)
        pod = self._kubelet.find_pod(request.pod_namespace, request.pod_name)
        if pod is None:
            message = f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
            context.abort(self._kubelet.get_not_found_code, message)
        return api_pb2.GetPodResourcesResponse(pod_resources=pod)


def _topology(numa_nodes: Iterable[int]) -> api_pb2.TopologyInfo | None:
    nodes = [api_pb2.NUMANode(ID=numa) for numa in numa_nodes if numa >= 0]
    return api_pb2.TopologyInfo(nodes=nodes) if nodes else None


def start_kubelet(
    node: SimulatedNode,
    socket_dir: str | Path | None = None,
    device_id_form: DeviceIdForm = "mig",
    *,
    group_devices: bool = False,
    rate_limit: RateLimit | None = None,
    get_not_found_code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
    poll_interval_s: float | None = 0.05,
) -> KubeletServer:
    """Start a pod-resources endpoint for ``node``; it stops when the node closes."""
    server = KubeletServer(
        node,
        socket_dir,
        device_id_form,
        group_devices=group_devices,
        rate_limit=rate_limit,
        get_not_found_code=get_not_found_code,
        poll_interval_s=poll_interval_s,
    )
    return server.start()
