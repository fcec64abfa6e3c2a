"""Receiver ``podresources``: which pod and container the kubelet gave each GPU, MIG device and replica.

It calls ``List`` on the kubelet's pod-resources API (gRPC, v1) over its unix socket, every tick or every
``refresh``, and emits one :class:`~pipeline.records.DeviceAllocation` per (pod, container, device id)
for the configured resource names. A time-sliced GPU shared by several pods yields one record per pod
(each holds its own replica id ``GPU-x::N``): *all* of them are kept, where dcgm-exporter keeps only one.

A record's ``time`` is when the kubelet gave the answer it comes from. An answer is reused, records and
times unchanged, between refreshes and while backing off, so ``batch.time - record.time`` is its age: at
most ``refresh`` normally, at most about ``backoff_max`` more while the kubelet is rate-limiting us.

Failure modes, each degrading rather than stopping (a failure raises a typed :class:`PodResourcesError`
out of ``collect()``, which the runtime counts in ``wattpipe_receiver_errors_total`` and logs,
rate-limited; the tick goes on without allocations):
- socket absent (kubelet not running, directory not mounted): one warning at start, then
  :class:`PodResourcesUnavailable` each tick until it appears; nothing is invented meanwhile;
- kubelet restarted (its socket unlinked and bound anew): the next tick dials a fresh channel;
- no answer within ``timeout``: :class:`PodResourcesUnavailable` (and a fresh channel next tick);
- RESOURCE_EXHAUSTED (the kubelet allows 100 calls/s, burst 10, for every client on the node): back
  off exponentially up to ``backoff_max``, reusing the last good answer meanwhile (rate-limited warning);
  with no answer yet, :class:`PodResourcesRateLimited`;
- a device id of an unknown form (e.g. the device plugin's ``deviceIDStrategy: index``): that device is
  skipped with a rate-limited warning naming it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field, field_validator

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.config import Duration
from wattpipe.pipeline.proto.podresources.v1 import api_pb2
from wattpipe.pipeline.records import Attrs, DeviceAllocation, Record
from wattpipe.pipeline.telemetry import ComponentTelemetry
from wattpipe.receivers.podresources._client import (
    KubeletClient,
    PodResourcesError,
    PodResourcesRateLimited,
    PodResourcesUnavailable,
    socket_path,
)
from wattpipe.receivers.podresources._device_id import DeviceIdForm, ParsedDeviceId, parse_device_id

__all__ = [
    "DEFAULT_ENDPOINT",
    "DeviceIdForm",
    "ParsedDeviceId",
    "PodResourcesConfig",
    "PodResourcesError",
    "PodResourcesRateLimited",
    "PodResourcesReceiver",
    "PodResourcesUnavailable",
    "ResourceMatcher",
    "factory",
    "parse_device_id",
]

DEFAULT_ENDPOINT = "unix:///var/lib/kubelet/pod-resources/kubelet.sock"
_FIRST_BACKOFF_S = 1.0


class PodResourcesConfig(ComponentConfig):
    endpoint: str = DEFAULT_ENDPOINT
    """gRPC target of the kubelet's pod-resources socket. Mount the *directory* into the container: a
    restarted kubelet binds a new socket file, which a mount of the file itself would never show."""
    refresh: Duration = Field(default=0.0, ge=0)
    """Call ``List`` at most this often, reusing the last answer in between; 0: every tick."""
    timeout: Duration = Field(default=2.0, gt=0)
    """How long one ``List`` may take."""
    resources: list[str] = Field(default_factory=lambda: ["nvidia.com/gpu", "nvidia.com/mig-*"])
    """Resource names to report; a trailing ``*`` matches any suffix."""
    extra_resources: list[str] = Field(default_factory=list)
    """More names, added to ``resources``: renamed shared resources such as ``nvidia.com/gpu.shared``."""
    backoff_max: Duration = Field(default=60.0, gt=0)
    """Longest wait between calls while the kubelet answers RESOURCE_EXHAUSTED (from 1 s, doubling)."""

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        path = socket_path(value)
        if not value or (path is not None and not path):
            raise ValueError(f"endpoint {value!r} names no socket; write unix:///path/to/kubelet.sock")
        if value.startswith("unix://") and not value.startswith("unix:///"):
            raise ValueError(f"endpoint {value!r}: unix:// takes an absolute path (unix:///var/lib/…)")
        return value

    @field_validator("resources", "extra_resources")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern.rstrip("*") or "*" in pattern.rstrip("*") or pattern.endswith("**"):
                raise ValueError(
                    f"resource {pattern!r}: write a name (nvidia.com/gpu) or a prefix ending in one * "
                    "(nvidia.com/mig-*)"
                )
        return value


@dataclass(frozen=True, slots=True)
class ResourceMatcher:
    """Resource names by exact name or by prefix (a pattern ending in ``*``)."""

    names: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def of(cls, patterns: Sequence[str]) -> ResourceMatcher:
        return cls(
            names=frozenset(p for p in patterns if not p.endswith("*")),
            prefixes=tuple(p[:-1] for p in patterns if p.endswith("*")),
        )

    def __call__(self, resource_name: str) -> bool:
        return resource_name in self.names or resource_name.startswith(self.prefixes)


@dataclass(frozen=True, slots=True)
class _Answer:
    at_s: float  # monotonic time of the List that gave it
    records: tuple[DeviceAllocation, ...]


class PodResourcesReceiver:
    provides = frozenset({"allocations"})

    def __init__(self, config: PodResourcesConfig, ctx: CreateContext) -> None:
        self.config = config
        self.component_id = ctx.component_id
        self.clock = ctx.clock
        self.log = ctx.logger
        self.rl: ComponentTelemetry = ctx.telemetry
        self.wanted = ResourceMatcher.of([*config.resources, *config.extra_resources])
        self.client = KubeletClient(config.endpoint, config.timeout)
        self._last: _Answer | None = None
        self._backoff_s = 0.0
        self._retry_at_s = -math.inf

    async def start(self) -> None:
        if not self.client.socket_exists():
            self.log.warning(
                "receiver %s: no kubelet socket at %s yet: no allocations until it appears (is the kubelet "
                "running, and is its pod-resources directory mounted?)",
                self.component_id,
                self.client.path,
            )

    async def shutdown(self) -> None:
        await self.client.close()

    async def collect(self) -> Sequence[Record]:
        now = self.clock.now()
        last = self._last
        if last is not None and now.monotonic_s - last.at_s < self.config.refresh:
            return list(last.records)
        if now.monotonic_s < self._retry_at_s:
            return self._reuse(now, last)
        try:
            response = await self.client.list()
        except PodResourcesRateLimited:
            self._backoff_s = min(self.config.backoff_max, self._backoff_s * 2 or _FIRST_BACKOFF_S)
            self._retry_at_s = now.monotonic_s + self._backoff_s
            return self._reuse(now, last)
        self._backoff_s, self._retry_at_s = 0.0, -math.inf
        records = self._records(response, now)
        self._last = _Answer(now.monotonic_s, tuple(records))
        return records

    def _reuse(self, now: Timestamp, last: _Answer | None) -> list[DeviceAllocation]:
        """While backing off: the last good answer, or a typed error where there is none."""
        if last is None:
            # One message whatever the attempt: the runtime's log key includes it, so it stays rate-limited.
            raise PodResourcesRateLimited(
                f"the kubelet at {self.config.endpoint} refuses List with RESOURCE_EXHAUSTED (rate limit) "
                "and no answer came before; backing off"
            )
        self._warn(
            "rate-limited",
            f"the kubelet at {self.config.endpoint} refuses List with RESOURCE_EXHAUSTED (rate limit); reusing "
            f"its answer from {now.monotonic_s - last.at_s:.0f}s ago, next try in "
            f"{max(0.0, self._retry_at_s - now.monotonic_s):.0f}s",
        )
        return list(last.records)

    def _records(self, response: api_pb2.ListPodResourcesResponse, now: Timestamp) -> list[DeviceAllocation]:
        out: list[DeviceAllocation] = []
        seen: set[tuple[str, str, str, str]] = set()
        for pod in response.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    if not self.wanted(devices.resource_name):
                        continue
                    for raw in devices.device_ids:
                        key = (pod.namespace, pod.name, container.name, raw)
                        if key in seen:
                            continue
                        seen.add(key)
                        parsed = parse_device_id(raw)
                        if parsed is None:
                            self._warn(
                                f"unknown-id/{raw}",
                                f"device id {raw!r} of {devices.resource_name} (pod {pod.namespace}/{pod.name}, "
                                f"container {container.name}) is of no known form (GPU-<uuid>, MIG-<uuid>, "
                                "MIG-GPU-<uuid>/<gi>/<ci>, each with an optional ::<replica>); skipped. Is the "
                                "device plugin's deviceIDStrategy 'index'? It must be 'uuid'",
                            )
                            continue
                        out.append(
                            DeviceAllocation(
                                time=now,
                                device_id=parsed.device_id,
                                resource_name=devices.resource_name,
                                pod_name=pod.name,
                                pod_namespace=pod.namespace,
                                container_name=container.name,
                                gpu_instance_id=parsed.gpu_instance_id,
                                replica=parsed.replica,
                                extra=_extra(parsed),
                            )
                        )
        return out

    def _warn(self, key: str, message: str) -> None:
        self.rl.log.log(logging.WARNING, key, f"receiver {self.component_id}: {message}")


def _extra(parsed: ParsedDeviceId) -> Attrs:
    """What a MIG id says beyond the record's fields: its form, and the MIG UUID or compute instance."""
    if parsed.form == "mig":
        return (("device_id_form", "mig"), ("mig_uuid", parsed.device_id))
    if parsed.form == "mig-legacy":
        return (("compute_instance_id", str(parsed.compute_instance_id)), ("device_id_form", "mig-legacy"))
    return ()


factory = Factory.of(
    PodResourcesReceiver,
    type="podresources",
    kind="receiver",
    config_model=PodResourcesConfig,
    description="GPU, MIG and time-sliced device allocations per pod and container, from the kubelet's "
    "pod-resources API.",
    stability="alpha",
    provides=frozenset({"allocations"}),
)
