"""The energy processor's running totals per device (energy, idle, active, unattributed, in integer mJ, and the
idle hold's level as last known): what ``kepler_node_gpu_*_joules_total`` exports and the state file keeps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.records import DevicePower, DeviceTotals
from wattpipe.processors._energy_series import start_at

__all__ = ["DeviceEnergy", "device_totals", "dumped", "held", "placed", "restored"]


@dataclass
class DeviceEnergy:
    energy_mj: int = 0
    idle_energy_mj: int = 0
    active_energy_mj: int = 0
    unattributed_energy_mj: int = 0
    start_wall_s: float = 0.0
    last: DevicePower | None = None
    held_mj: int = 0  # its held level as saved, until it has a DevicePower again (``last``)
    seen_s: float | None = None  # monotonic time it last answered (or this start's first tick); not saved
    gone_s: float | None = None  # monotonic time it was found gone (its series ended then); None: not gone
    # when it was found gone, as the state file had it (a wall time): placed on this run's clock (gone_s) at this
    # start's first tick it does not answer in, so that a device gone before a restart is not exported again
    gone_wall_s: float | None = None


def held(d: DeviceEnergy) -> int:
    """The device's held level: its last DevicePower's, else as the state file had it."""
    return d.last.held_energy_mj if d.last is not None else d.held_mj


def dumped(devices: Mapping[str, DeviceEnergy], wall_offset_s: float | None = None) -> dict[str, dict[str, Any]]:
    """The state section's ``devices``, by device id (``wall_offset_s``: the wall clock less the monotonic one at
    the last tick, which saves when a gone device was found gone as a wall time)."""
    return {
        device_id: {
            "energy_mj": d.energy_mj,
            "idle_energy_mj": d.idle_energy_mj,
            "active_energy_mj": d.active_energy_mj,
            "unattributed_energy_mj": d.unattributed_energy_mj,
            "start_wall_s": d.start_wall_s,
            # Attribution's hold survives a restart: until the device answers again, its ended series
            # wait for the late energy as they did before it.
            "held_energy_mj": held(d),
            "gone_wall_s": _gone_wall_s(d, wall_offset_s),
        }
        for device_id, d in sorted(devices.items())
    }


def _gone_wall_s(d: DeviceEnergy, wall_offset_s: float | None) -> float | None:
    if d.gone_s is not None and wall_offset_s is not None:
        return d.gone_s + wall_offset_s
    return d.gone_wall_s  # (restored and not placed yet: as the state file had it)


def placed(d: DeviceEnergy, now: Timestamp) -> None:
    """A device restored gone (and silent since this start) placed on this run's monotonic clock by the wall
    time since it was found gone, never below 0 (as :func:`ended_age_s` places an ended series)."""
    if d.gone_wall_s is not None and d.gone_s is None:
        d.gone_s = now.monotonic_s - max(0.0, now.wall_s - d.gone_wall_s)
    d.gone_wall_s = None


def restored(saved: Mapping[Any, Any]) -> dict[str, DeviceEnergy]:
    """:func:`dumped`'s devices back; a bad row raises."""
    return {str(device_id): _restored(row) for device_id, row in dict(saved).items()}


def _restored(row: dict[str, Any]) -> DeviceEnergy:
    return DeviceEnergy(
        energy_mj=int(row["energy_mj"]),
        idle_energy_mj=int(row["idle_energy_mj"]),
        active_energy_mj=int(row["active_energy_mj"]),
        unattributed_energy_mj=int(row["unattributed_energy_mj"]),
        start_wall_s=float(row["start_wall_s"]),
        held_mj=int(row.get("held_energy_mj", 0)),
        gone_wall_s=None if row.get("gone_wall_s") is None else float(row["gone_wall_s"]),
    )


def device_totals(devices: Mapping[str, DeviceEnergy], now: Timestamp, retention_s: float) -> tuple[DeviceTotals, ...]:
    """A ``DeviceTotals`` per device, in id order, but those gone for longer than ``retention_s`` (monotonic):
    not exported, though kept (a device that comes back goes on counting from where it was)."""
    out = []
    for device_id, d in sorted(devices.items()):
        if d.gone_s is not None and now.monotonic_s - d.gone_s > retention_s:
            continue
        last = d.last
        out.append(
            DeviceTotals(
                time=now,
                device_id=device_id,
                device_type=last.device_type if last else "gpu",
                device_index=last.device_index if last else None,
                device_name=last.device_name if last else None,
                vendor=last.vendor if last else None,
                energy_mj=d.energy_mj,
                idle_energy_mj=d.idle_energy_mj,
                active_energy_mj=d.active_energy_mj,
                attributed_energy_mj=d.active_energy_mj - d.unattributed_energy_mj,
                unattributed_energy_mj=d.unattributed_energy_mj,
                start=start_at(now, d.start_wall_s),
            )
        )
    return tuple(out)
