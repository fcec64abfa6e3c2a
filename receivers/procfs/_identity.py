"""What never changes over a process's life, read once per (pid, start time): :class:`Identity`."""

from __future__ import annotations

from dataclasses import dataclass, field

from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.constructors import new_host_process
from wattpipe.pipeline.records import HostProcess
from wattpipe.receivers.procfs._cgroup import CgroupIdentity
from wattpipe.receivers.procfs._vm import VmIdentity

__all__ = ["Identity"]


@dataclass(frozen=True, slots=True)
class Identity:
    """What never changes over a process's life, read once per (pid, start time)."""

    start_time_ticks: int
    comm: str
    exe: str | None
    cgroup: CgroupIdentity
    vm: VmIdentity | None = None  # a qemu process's VM, from its cmdline
    cgroup_path: str | None = None  # its cgroup v2 path, for cgroup_root's cpu.stat
    # Its stat line through comm (exec_head): a line that differs there is of a process that exec'd since (a
    # container's first process is runc's until its runtime starts it), whose identity is read again.
    stat_head: bytes | None = None
    # comm, exe, container_id, container_runtime, pod_uid, vm_id, vm_name, hypervisor: a record's own, made once
    fields: tuple[str, str | None, str | None, str | None, str | None, str | None, str | None, str | None] = field(
        init=False
    )

    def __post_init__(self) -> None:
        cg, vm = self.cgroup, self.vm
        ids = (None, None, None) if vm is None else (vm.vm_id, vm.vm_name, vm.hypervisor)
        object.__setattr__(self, "fields", (self.comm, self.exe, cg.container_id, cg.runtime, cg.pod_uid, *ids))

    def describes(self, line: bytes) -> bool:
        """Whether a later stat line of the same process (pid and start time) is still of what this read."""
        head = self.stat_head
        return head is None or line[: line.rfind(b")") + 1] == head

    def record(self, now: Timestamp, pid: int, cpu_time_s: float | None, start_wall_s: float | None) -> HostProcess:
        """This process's record as read at ``now``."""
        comm, exe, container_id, runtime, pod_uid, vm_id, vm_name, hypervisor = self.fields
        return new_host_process(
            now,
            (),
            pid,
            comm,
            exe,
            self.start_time_ticks,
            container_id,
            runtime,
            pod_uid,
            cpu_time_s,
            start_wall_s,
            vm_id,
            vm_name,
            hypervisor,
        )
