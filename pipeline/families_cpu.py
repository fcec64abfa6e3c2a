"""The CPU families (seed 002): RAPL zones and what the ``cpu_attribution`` processor bills to processes,
containers, pods and VMs, in Kepler's names (``kepler_node_cpu_*``, ``kepler_{process,container,pod,vm}_cpu_*``)
and OpenTelemetry's."""

from __future__ import annotations

from typing import Literal

from wattpipe.pipeline.families import _CPU, _CPU_TOTALS, _K8S, _MJ, Family, Instrument, _consumer_families
from wattpipe.pipeline.records import DevicePower, DeviceTotals, HostProcess, NodeCpuTime, Record
from wattpipe.pipeline.records_cpu import CpuInfo

__all__ = ["CPU_FAMILIES"]

_ZONE = ("zone", "path")


def _cpu_node(kepler: str, otel: str, record: type[Record], value: str, unit: str, help: str) -> Family:
    instrument: Instrument = "counter" if unit == "J" else "gauge"
    divisor = _MJ if unit == "J" else 1
    return Family(kepler, otel, record, value, instrument, unit, help, (), optional=_ZONE, where=_CPU, divisor=divisor)


def _cpu_consumer(
    scope: Literal["process", "container", "pod", "vm"], key: str, optional: tuple[str, ...]
) -> tuple[Family, Family]:
    who = "VM" if scope == "vm" else scope
    kind: Literal["process", "container", "pod"] = "container" if scope == "vm" else scope
    return _consumer_families(
        scope,
        "cpu",
        kind,
        key,
        (key, "state"),
        ("zone", *optional),
        (("scope", scope), ("device_id", _CPU_TOTALS)),
        f"CPU energy (a RAPL zone type's active energy) attributed to a {who} by CPU time since its series "
        "began; terminated series stay for cpu_attribution's retention.",
        f"CPU power attributed to a {who} in one zone type over the last tick (0 once terminated).",
    )


_CPU_NODE: tuple[tuple[str, str, type[Record], str, str, str], ...] = (
    ("kepler_node_cpu_watts", "wattpipe.cpu.power", DevicePower, "power_w", "W", "A RAPL zone's power over the last tick."),
    ("kepler_node_cpu_active_watts", "wattpipe.cpu.power.active", DevicePower, "active_w", "W",
     "A RAPL zone's active power (× the node's CPU usage ratio, or above the configured idle); a tick whose /proc "
     "listing failed holds it, and the tick that releases it adds it."),
    ("kepler_node_cpu_idle_watts", "wattpipe.cpu.power.idle", DevicePower, "idle_w", "W",
     "A RAPL zone's idle power over the last tick (its power − active, but on a tick that holds or releases "
     "energy: a failed /proc listing)."),
    ("kepler_node_cpu_joules_total", "wattpipe.cpu.energy", DeviceTotals, "energy_mj", "J",
     "A RAPL zone's energy since the series began (energy held over a failed /proc listing counted once "
     "released)."),
    ("kepler_node_cpu_active_joules_total", "wattpipe.cpu.energy.active", DeviceTotals, "active_energy_mj", "J",
     "A RAPL zone's active energy (attributed + unattributed)."),
    ("kepler_node_cpu_idle_joules_total", "wattpipe.cpu.energy.idle", DeviceTotals, "idle_energy_mj", "J",
     "A RAPL zone's idle energy."),
    ("wattpipe_node_cpu_unattributed_joules_total", "wattpipe.cpu.energy.unattributed", DeviceTotals,
     "unattributed_energy_mj", "J",
     "A RAPL zone's active energy no process carried (no CPU time seen, /proc/stat or the listing did not "
     "answer and could not be held)."),
)  # fmt: skip

_NODE_CPU: tuple[Family, ...] = (
    Family(
        "wattpipe_node_cpu_held_joules",
        "wattpipe.cpu.energy.held",
        DevicePower,
        "held_energy_mj",
        "gauge",
        "J",
        "A RAPL zone's energy held over a failed /proc listing (its active part; all of it where /proc/stat failed "
        "too), to be split with the next listing's CPU time: in no total yet (the zone's joules total lags its "
        "counter by it, and counts it once released).",
        (),
        optional=_ZONE,
        where=_CPU,
        divisor=_MJ,
    ),
    Family(
        "kepler_node_cpu_usage_ratio",
        "system.cpu.utilization",
        NodeCpuTime,
        "usage_ratio",
        "gauge",
        "1",
        "The node's CPU usage ratio over the last tick (0–1): Δ(total − idle − iowait) / Δtotal of /proc/stat, "
        "the ratio cpu_attribution splits active from idle energy by; absent on the first tick.",
        (),
        where=(("usage_ratio", "!None"),),
        extras=False,
    ),
    Family(
        "kepler_node_cpu_info",
        "wattpipe.cpu.info",
        CpuInfo,
        None,
        "info",
        "",
        "A logical CPU as /proc/cpuinfo describes it (always 1); a key the kernel does not write is absent.",
        ("processor", "vendor_id", "model_name", "physical_id", "core_id"),
        extras=False,
    ),
    Family(
        "kepler_process_cpu_seconds_total",
        "process.cpu.time",
        HostProcess,
        "cpu_time_s",
        "counter",
        "s",
        "A process's user + system CPU time since it started (/proc/<pid>/stat utime + stime), for every process "
        "procfs reads with cpu_time: true.",
        ("pid", "comm", "exe", "type", "container_id", "vm_id"),
        where=(("cpu_time_s", "!None"),),
        extras=False,
        kind="process",
    ),
)

CPU_FAMILIES: tuple[Family, ...] = (
    *(_cpu_node(*row) for row in _CPU_NODE),
    *_NODE_CPU,
    *_cpu_consumer(
        "process", "pid", ("comm", "exe", "type", "container_id", "vm_id", "pod_uid", *_K8S, "series_start")
    ),
    *_cpu_consumer("container", "container_id", ("container_name", "runtime", "pod_uid", *_K8S)),
    *_cpu_consumer("pod", "pod_uid", _K8S),
    *_cpu_consumer("vm", "vm_id", ("vm_name", "hypervisor")),
)
"""After the GPU and saturation families in :data:`pipeline.catalog.FAMILIES` (docs/metrics.md: its CPU section)."""
