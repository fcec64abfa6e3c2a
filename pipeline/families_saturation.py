"""The saturation families (``processors/saturation.py``, docs/saturation.md) and the cluster's GPU gauges
(the ``k8s_cluster`` receiver): a signal per GPU, MIG instance and pod container, named in both schemes.
``pipeline/catalog.py`` puts them after the energy and topology families of ``pipeline/families.py``."""

from __future__ import annotations

from wattpipe.pipeline.families import Family
from wattpipe.pipeline.records import ClusterGpu, Saturation

__all__ = ["SATURATION_FAMILIES", "SATURATION_SIGNALS"]


_SAT_RATIO, _SAT_RATE, _SAT_COUNT = "1", "By/s", "{error}"
_THROTTLE = "Fraction of the window the clocks were held back by the {} (Δ violation counter / Δ time, 0–1)."
_EVENT = "Fraction of the window's observations with the {} clock-event reason set (0–1)."
# Every saturation signal: the name the report and the record use, its unit, its help.
SATURATION_SIGNALS: tuple[tuple[str, str, str], ...] = (
    ("throttle_power", _SAT_RATIO, _THROTTLE.format("power limit")),
    ("throttle_thermal", _SAT_RATIO, _THROTTLE.format("thermal limit")),
    ("throttle_sync_boost", _SAT_RATIO, _THROTTLE.format("sync-boost group")),
    ("throttle_board_limit", _SAT_RATIO, _THROTTLE.format("board limit")),
    ("clock_event_sw_power_cap", _SAT_RATIO, _EVENT.format("sw_power_cap (0x4)")),
    ("clock_event_hw_slowdown", _SAT_RATIO, _EVENT.format("hw_slowdown (0x8)")),
    ("clock_event_sync_boost", _SAT_RATIO, _EVENT.format("sync_boost (0x10)")),
    ("clock_event_sw_thermal", _SAT_RATIO, _EVENT.format("sw_thermal (0x20)")),
    ("clock_event_hw_thermal", _SAT_RATIO, _EVENT.format("hw_thermal (0x40)")),
    ("clock_event_hw_power_brake", _SAT_RATIO, _EVENT.format("hw_power_brake (0x80)")),
    ("memory_used_avg", _SAT_RATIO, "Mean framebuffer used / total over the window (0–1)."),
    ("memory_used_max", _SAT_RATIO, "Highest framebuffer used / total in the window (0–1)."),
    ("memory_pressure", _SAT_RATIO, "Fraction of the window with framebuffer use at or above the threshold (0–1)."),
    ("xid_count", _SAT_COUNT, "XID errors in the window (exact from NVML events; dcgm's last code undercounts)."),
    ("dram_active_avg", _SAT_RATIO, "Mean DRAM interface activity over the window (DCGM DRAM_ACTIVE, 0–1)."),
    ("dram_active_max", _SAT_RATIO, "Highest DRAM interface activity in the window (0–1)."),
    ("sm_active_avg", _SAT_RATIO, "Mean fraction of cycles an SM had a warp assigned (DCGM SM_ACTIVE, 0–1)."),
    ("sm_active_max", _SAT_RATIO, "Highest SM_ACTIVE in the window (0–1)."),
    ("sm_occupancy_avg", _SAT_RATIO, "Mean resident warps / the SM's maximum (DCGM SM_OCCUPANCY, 0–1)."),
    ("sm_occupancy_max", _SAT_RATIO, "Highest SM_OCCUPANCY in the window (0–1)."),
    ("pcie_tx_bytes_per_s", _SAT_RATE, "Mean PCIe transmit rate over the window (bytes/s, headers included)."),
    ("pcie_rx_bytes_per_s", _SAT_RATE, "Mean PCIe receive rate over the window (bytes/s, headers included)."),
    ("nvlink_tx_bytes_per_s", _SAT_RATE, "Mean NVLink transmit rate over the window (bytes/s, payload only)."),
    ("nvlink_rx_bytes_per_s", _SAT_RATE, "Mean NVLink receive rate over the window (bytes/s, payload only)."),
)


def _metric_stem(signal: str) -> str:
    """The signal's name in metric names: ``xid_count`` is written ``xid_errors``, because Prometheus reads a
    name ending in ``_count`` as a histogram's or summary's count (promtool rejects it on a gauge)."""
    return "xid_errors" if signal == "xid_count" else signal


def _saturation_kepler(consumer: str, signal: str, unit: str) -> str:
    stem = _metric_stem(signal).removesuffix("_bytes_per_s")
    suffix = {_SAT_RATIO: "_ratio", _SAT_RATE: "_bytes_per_second", _SAT_COUNT: ""}[unit]
    return f"wattpipe_{consumer}gpu_{stem}{suffix}"


def _saturation_families() -> tuple[Family, ...]:
    out: list[Family] = []
    for signal, unit, help in SATURATION_SIGNALS:
        for pod in (False, True):
            out.append(
                Family(
                    _saturation_kepler("pod_" if pod else "", signal, unit),
                    f"wattpipe.{'pod.' if pod else ''}gpu.saturation.{_metric_stem(signal)}",
                    Saturation,
                    "value",
                    "gauge",
                    unit,
                    (f"A pod container's view of its GPU or MIG instance. {help}" if pod else help),
                    (
                        *(("pod_name", "pod_namespace", "container_name") if pod else ()),
                        "device_index",
                        "device_id",
                        "gpu_instance_id",
                        "saturation_scope",
                    ),
                    where=(("signal", signal), ("pod_name", "!None" if pod else "None")),
                    extras=False,
                    kind="pod" if pod else "device",
                )
            )
    return tuple(out)


def _cluster(name: str, unit: str, help: str) -> Family:
    return Family(
        f"cluster_gpu_{name}",
        f"wattpipe.cluster.gpu.{name}",
        ClusterGpu,
        name,
        "gauge",
        unit,
        help,
        ("resource_name",),
        extras=False,
    )


SATURATION_FAMILIES: tuple[Family, ...] = (
    *_saturation_families(),
    _cluster(
        "pending_pod_count", "{pod}", "Pods waiting to be scheduled that request this GPU resource (k8s_cluster)."
    ),
    _cluster(
        "pending_request_total",
        "{device}",
        "Devices of this GPU resource that pending pods request, summed over their containers (k8s_cluster).",
    ),
    _cluster(
        "requested_allocatable_ratio",
        "1",
        "Devices of this resource requested by non-terminated pods, pending ones included, / allocatable on all "
        "nodes (k8s_cluster): above 1 when demand exceeds the cluster; absent where nothing is allocatable.",
    ),
)
