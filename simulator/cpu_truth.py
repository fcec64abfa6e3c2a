"""The CPU side of the ground truth: each workload's own dynamic CPU energy, to hold attribution against.

The host model (``simulator/truth.py``): a package zone draws ``idle_w / packages + w_per_core / packages ·
Σ cpu_cores`` of the live processes, a DRAM zone ``dram_w + dram_w_per_core / packages · Σ cpu_cores``. A
process's true CPU energy is its own dynamic part, ``(w_per_core + dram_w_per_core) · cpu_cores · seconds
alive``, over every zone; a container's, pod's and VM's are the sums of their processes' (a process that moved
without an exec, ``moves``, counts in each container for the time it was in it). Idle power is nobody's. A VM
is a qemu process whose cmdline names it (``-uuid``, ``-name``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise

from wattpipe.simulator.truth import GroundTruth

__all__ = ["CpuTruth", "qemu_identity"]


def qemu_identity(cmdline: Sequence[str] | None) -> tuple[str, str | None] | None:
    """(uuid, name) of a qemu cmdline's ``-uuid`` and ``-name`` (its ``guest=`` part); None without ``-uuid``."""
    if not cmdline:
        return None
    uuid = name = None
    for flag, value in pairwise(cmdline):
        if flag == "-uuid":
            uuid = value
        elif flag == "-name":
            first = value.split(",")[0]
            name = first.removeprefix("guest=")
    return (uuid, name) if uuid else None


class CpuTruth:
    """True dynamic CPU energy and CPU time per process, container, pod and VM over a window of scenario time."""

    def __init__(self, truth: GroundTruth) -> None:
        self.truth = truth
        cpu = truth.scenario.cpu
        self.w_per_core = cpu.w_per_core + cpu.dram_w_per_core
        self.vms: dict[str, list[int]] = {}
        self.vm_names: dict[str, str | None] = {}  # its qemu's -name (guest=…), None without one
        for process in truth.scenario.processes:
            identity = qemu_identity(process.cmdline)
            if identity is not None:
                self.vms.setdefault(identity[0], []).append(process.pid)
                self.vm_names.setdefault(identity[0], identity[1])

    def process_cpu_s(self, pid: int, t0_s: float, t1_s: float) -> float:
        return self.truth.process_cpu_s(pid, t1_s) - self.truth.process_cpu_s(pid, t0_s)

    def process_energy_j(self, pid: int, t0_s: float, t1_s: float) -> float:
        return self.w_per_core * self.process_cpu_s(pid, t0_s, t1_s)

    def sum_energy_j(self, pids: Sequence[int], t0_s: float, t1_s: float) -> float:
        return sum(self.process_energy_j(pid, t0_s, t1_s) for pid in pids)

    def container_energy_j(self, ref: str, t0_s: float, t1_s: float) -> float:
        """``ref`` is ``namespace/pod/container``: its processes' energy while they were in it (``moves``)."""
        return self.w_per_core * self._cpu_in(lambda container: container == ref, t0_s, t1_s)

    def pod_energy_j(self, namespace: str, pod: str, t0_s: float, t1_s: float) -> float:
        prefix = f"{namespace}/{pod}/"
        return self.w_per_core * self._cpu_in(lambda c: c is not None and c.startswith(prefix), t0_s, t1_s)

    def _cpu_in(self, member: Callable[[str | None], bool], t0_s: float, t1_s: float) -> float:
        """CPU seconds in ``[t0_s, t1_s]`` of every process while in a container ``member`` accepts."""
        cpu_s = 0.0
        for process in self.truth.scenario.processes:
            for from_s, until_s, container in process.placements():
                start_s, end_s = max(t0_s, from_s), min(t1_s, until_s)
                if start_s < end_s and member(container):
                    cpu_s += self.process_cpu_s(process.pid, start_s, end_s)
        return cpu_s

    def zone_energy_j(self, zone: str, package: int, t0_s: float, t1_s: float) -> float:
        """A RAPL zone's true energy between two instants (what its counter must have counted)."""
        energy = self.truth.cpu_dram_energy_j if zone == "dram" else self.truth.cpu_package_energy_j
        return energy(package, t1_s) - energy(package, t0_s)
