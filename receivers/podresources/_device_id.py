"""The device ids the NVIDIA device plugin hands the kubelet, and what each says about the hardware.

The plugin (``deviceIDStrategy: uuid``, its default) names a device in one of these forms, with
``::<replica>`` appended when the device is shared by time-slicing or MPS (each replica is a separate
allocatable "device" to the kubelet, so two pods on one GPU get ``GPU-x::0`` and ``GPU-x::1``):

- ``GPU-<uuid>``: a whole GPU;
- ``MIG-<uuid>``: a MIG device as R470+ drivers name it. Its UUID is the MIG device's own, which does
  not contain the parent GPU's UUID or the GPU instance: only NVML can map it back
  (:class:`~pipeline.records.MigInstance` carries ``mig_uuid`` for that join, made by the ``k8s`` processor);
- ``MIG-GPU-<uuid>/<gi>/<ci>``: a MIG device as older drivers name it: parent GPU, GPU instance and
  compute instance are all in the id.

``deviceIDStrategy: index`` names devices ``0``, ``1``, …, which cannot be joined to a GPU across a
reboot or a re-plug: that, and anything else, is an unknown form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["DeviceIdForm", "ParsedDeviceId", "parse_device_id"]

DeviceIdForm = Literal["gpu", "mig", "mig-legacy"]
"""``gpu``: ``GPU-<uuid>``; ``mig``: ``MIG-<uuid>``; ``mig-legacy``: ``MIG-GPU-<uuid>/<gi>/<ci>``."""

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_REPLICA = r"(?:::(?P<replica>[0-9]{1,9}))?"
_GPU_RE = re.compile(rf"(?P<gpu>GPU-{_UUID}){_REPLICA}")
_MIG_RE = re.compile(rf"(?P<mig>MIG-{_UUID}){_REPLICA}")
_MIG_LEGACY_RE = re.compile(rf"MIG-(?P<gpu>GPU-{_UUID})/(?P<gi>[0-9]{{1,4}})/(?P<ci>[0-9]{{1,4}}){_REPLICA}")


@dataclass(frozen=True, slots=True)
class ParsedDeviceId:
    """What one device id says.

    ``device_id`` is the parent GPU's UUID for ``gpu`` and ``mig-legacy``; for ``mig`` it is the MIG
    device's UUID (the parent is not in the id). ``gpu_instance_id`` / ``compute_instance_id`` are known
    only for ``mig-legacy``.
    """

    raw: str
    form: DeviceIdForm
    device_id: str
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    replica: int | None = None


def parse_device_id(raw: str) -> ParsedDeviceId | None:
    """The meaning of a device-plugin id, or None for a form this receiver does not know."""
    if match := _GPU_RE.fullmatch(raw):
        return ParsedDeviceId(raw, "gpu", match["gpu"], replica=_replica(match))
    if match := _MIG_LEGACY_RE.fullmatch(raw):
        return ParsedDeviceId(
            raw,
            "mig-legacy",
            match["gpu"],
            gpu_instance_id=int(match["gi"]),
            compute_instance_id=int(match["ci"]),
            replica=_replica(match),
        )
    # After the legacy form: "MIG-GPU-…" is never a MIG UUID, and the UUID pattern cannot match "GPU-…".
    if match := _MIG_RE.fullmatch(raw):
        return ParsedDeviceId(raw, "mig", match["mig"], replica=_replica(match))
    return None


def _replica(match: re.Match[str]) -> int | None:
    text = match["replica"]
    return None if text is None else int(text)
