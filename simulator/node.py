"""The simulated node: a scenario, its ground truth and one clock, shared by every face.

Scenario time ``t_s`` is the clock's monotonic time minus the monotonic time at which the node was
built, so ``clock.advance(5.0)`` moves the NVML library, the dcgm-exporter, /proc and /sys together.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from wattpipe.pipeline.clock import Clock
from wattpipe.simulator._faults import DcgmFault, K8sApiFault, KubeletFault, NvmlFault, ProcfsFault, RaplFault
from wattpipe.simulator.scenario import Scenario, load_scenario
from wattpipe.simulator.truth import GroundTruth

__all__ = ["SimulatedNode", "build"]


class SimulatedNode:
    """One GPU node in software. Build it with :func:`build` (or :func:`simulator.install`)."""

    def __init__(self, scenario: Scenario, clock: Clock) -> None:
        self.scenario = scenario
        self.clock = clock
        self.truth = GroundTruth(scenario)
        start = clock.now()
        self.start_monotonic_s = start.monotonic_s
        self.start_wall_s = start.wall_s
        self._closers: list[Callable[[], None]] = []
        self._nvml_faults = [f for f in scenario.faults if isinstance(f, NvmlFault)]
        # Per GPU, the (start, back) times of its driver reloads, in order: the counter's origin moves to each "back".
        self._reloads: list[list[tuple[float, float]]] = [
            sorted(
                (f.at_s, f.until_s)
                for f in self._nvml_faults
                if f.kind == "reload" and (f.gpu is None or f.gpu == index)
            )
            for index in range(len(scenario.gpus))
        ]

    # --- time --------------------------------------------------------------------------------------

    def t_s(self) -> float:
        """Scenario seconds now (0 = when the node was built)."""
        return self.clock.monotonic() - self.start_monotonic_s

    def wall_at(self, t_s: float) -> float:
        """Unix seconds at scenario time ``t_s``."""
        return self.start_wall_s + t_s

    # --- derived readings shared by several faces ------------------------------------------------

    def energy_counter_mj(self, gpu: int, t_s: float) -> int:
        """The hardware energy counter: integer mJ since the driver loaded (``uptime_s`` before t=0, or the
        end of the last ``reload`` fault begun by ``t_s``; 0 while the driver is reloading)."""
        loaded_s: float | None = None
        for at_s, back_s in self._reloads[gpu]:
            if at_s <= t_s:
                loaded_s = back_s
        if loaded_s is None:
            since_load_j = self.scenario.gpus[gpu].idle_w * self.scenario.node.uptime_s
            return math.floor((since_load_j + self.truth.device_energy_j(gpu, t_s)) * 1000.0)
        since_load_j = self.truth.device_energy_j(gpu, t_s) - self.truth.device_energy_j(gpu, loaded_s)
        return math.floor(max(0.0, since_load_j) * 1000.0)

    def power_reading_mw(self, gpu: int, t_s: float) -> int:
        """What the power sensor reports: the 1-second average, in integer mW."""
        return round(self.truth.device_average_power_w(gpu, t_s, 1.0) * 1000.0)

    def temperature_c(self, gpu: int, t_s: float) -> int:
        """A synthetic die temperature that rises with load: 30 °C idle, 80 °C at the power cap."""
        state = self.truth.gpu_state(gpu, t_s)
        power_w = self.truth.device_average_power_w(gpu, t_s, 1.0)
        load = (power_w - state.idle_w) / max(1e-9, state.max_w - state.idle_w)
        return round(30 + 50 * min(1.0, max(0.0, load)))

    # --- faults ------------------------------------------------------------------------------------

    def nvml_fault(self, symbol: str, gpu: int | None, t_s: float) -> int | None:
        """The NVML error code a call must answer now, or None to answer normally."""
        for fault in self._nvml_faults:
            if not fault.active(t_s):
                continue
            if fault.call is not None and fault.call != symbol:
                continue
            if fault.gpu is not None and fault.gpu != gpu:
                continue
            if fault.call is None and gpu is None:
                continue  # a device-wide fault does not break calls that name no device
            return fault.code
        return None

    def service_fault(self, target: str, t_s: float) -> DcgmFault | KubeletFault | K8sApiFault | None:
        """The active fault of a network face (``dcgm``, ``kubelet``, ``k8sapi``), if any."""
        for fault in self.scenario.faults:
            if (
                isinstance(fault, DcgmFault | KubeletFault | K8sApiFault)
                and fault.target == target
                and fault.active(t_s)
            ):
                return fault
        return None

    def rapl_gone(self, zone: str, t_s: float) -> bool:
        """Whether a ``rapl`` fault keeps RAPL zone ``zone`` (its directory name) out of the powercap tree now."""
        return any(isinstance(f, RaplFault) and f.zone in (None, zone) and f.active(t_s) for f in self.scenario.faults)

    def procfs_gone(self, t_s: float) -> bool:
        """Whether a ``procfs`` fault keeps the node's /proc away now."""
        return any(isinstance(f, ProcfsFault) and f.active(t_s) for f in self.scenario.faults)

    # --- lifecycle ---------------------------------------------------------------------------------

    def on_close(self, closer: Callable[[], None]) -> None:
        """Run ``closer`` when the node closes (servers started for this node register here)."""
        self._closers.append(closer)

    def close(self) -> None:
        """Stop every face started for this node (last started, first stopped)."""
        while self._closers:
            self._closers.pop()()

    def __enter__(self) -> SimulatedNode:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def build(scenario: Scenario | str | Path, clock: Clock) -> SimulatedNode:
    """A node from a scenario (or a scenario file), with its scenario time starting now.

    Builds the ground truth only; the faces are started separately (``simulator.install`` for NVML,
    ``simulator.dcgm_server.start_dcgm_exporter``, ``simulator.fake_host.ProcfsWriter``).
    """
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    return SimulatedNode(scenario, clock)
