"""A scenario's process (``processes:`` in a scenario file): what it runs, where, for how long, and what it draws.

Split from ``scenario.py``, which re-exports every name here; the schema is documented in docs/simulator.md.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from wattpipe.simulator._schema_base import _Model

__all__ = ["Init", "Move", "Process"]


def _absolute_cgroup(path: str | None) -> str | None:
    if path is not None and not path.startswith("/"):
        raise ValueError(
            f"{path!r} must start with / (a path from the cgroup root, as /proc/<pid>/cgroup shows it: "
            "/system.slice/backup.service)"
        )
    return path


class Init(_Model):
    """What a container's process is before it execs its own command: its runtime's init (``runc:[2:INIT]``,
    ``runc init``), from its start until the runtime starts it at ``exec_s`` (scenario time), already in its
    container's cgroup and drawing its CPU (the truth is the process's throughout)."""

    comm: str = Field(default="runc:[2:INIT]", min_length=1, max_length=15)
    cmdline: list[str] = Field(default_factory=lambda: ["runc", "init"])
    exec_s: float = Field(gt=0)


class Move(_Model):
    """The process moved to another cgroup without an exec at ``at_s`` (scenario time): a runtime placing a
    process it started, ``systemd-run --scope``, a process adopted into another container (``echo $pid >
    cgroup.procs``). From then on its ``/proc/<pid>/cgroup`` names the new cgroup, its CPU time grows that
    cgroup's usage, and the truth bills its CPU energy to the container it is in (the one it left keeps what it
    ran there)."""

    at_s: float = Field(gt=0)
    container: str | None = None  # "namespace/pod/container"; None = a host process
    cgroup: str | None = None  # overrides the derived cgroup path

    _cgroup_absolute = field_validator("cgroup")(_absolute_cgroup)


class Process(_Model):
    pid: int = Field(gt=1, lt=4_194_304)
    comm: str = Field(min_length=1, max_length=15)  # the kernel truncates comm to 15 bytes
    cmdline: list[str] | None = None  # None → [comm]
    ppid: int = 1
    container: str | None = None  # "namespace/pod/container"; None = a host process
    cgroup: str | None = None  # overrides the derived cgroup path
    gpu: int | None = Field(default=None, ge=0)
    gi: int | None = None
    dynamic_w: float | None = Field(default=None, ge=0)  # W per unit of SM utilisation
    util: list[tuple[float, float]] = Field(default_factory=list)  # [at_s, fraction], scenario time
    # W per unit of memory utilisation (the driver's per-process memUtil: the share of time the memory
    # was read or written), on top of the SM part: two tenants at the same SM utilisation then draw
    # different watts, as a tensor-core trainer and a memory-bound server do. 0: the SM part is all.
    mem_w: float = Field(default=0.0, ge=0)
    mem_util: list[tuple[float, float]] = Field(default_factory=list)  # [at_s, fraction]; default 0
    start_s: float = Field(default=0.0, ge=0)
    end_s: float | None = None
    cpu_cores: float = Field(default=0.0, ge=0)
    # The share of its CPU time spent in user mode (/proc's utime; the rest is stime): the kernel truncates each
    # to whole clock ticks apart, so a process's reading is short by up to two ticks, not one.
    user_share: float = Field(default=0.9, ge=0, le=1)
    memory_mib: float = Field(default=0.0, ge=0)
    init: Init | None = None  # runc's init until it execs (its comm and cmdline then; None: its own from the start)
    moves: list[Move] = Field(default_factory=list)  # to other cgroups without an exec, in time order

    _cgroup_absolute = field_validator("cgroup")(_absolute_cgroup)

    def comm_at(self, t_s: float) -> str:
        return self.init.comm if self.init is not None and t_s < self.init.exec_s else self.comm

    def cmdline_at(self, t_s: float) -> list[str]:
        if self.init is not None and t_s < self.init.exec_s:
            return self.init.cmdline
        return self.cmdline or [self.comm]

    def placement_at(self, t_s: float) -> tuple[str | None, str | None]:
        """(container, cgroup override) the process is in at ``t_s``: its own until its first move's ``at_s``."""
        placement = (self.container, self.cgroup)
        for move in self.moves:
            if move.at_s <= t_s:
                placement = (move.container, move.cgroup)
        return placement

    def placements(self) -> list[tuple[float, float, str | None]]:
        """[from_s, until_s, container] spans of scenario time, its start to its end (inf: to the end)."""
        times = [self.start_s, *(move.at_s for move in self.moves), self.end_s or float("inf")]
        containers = [self.container, *(move.container for move in self.moves)]
        return [(times[i], times[i + 1], containers[i]) for i in range(len(containers))]

    @model_validator(mode="after")
    def _check(self) -> Process:
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be after start_s ({self.start_s})")
        exec_s = None if self.init is None else self.init.exec_s
        if exec_s is not None and not (self.start_s < exec_s and (self.end_s is None or exec_s < self.end_s)):
            raise ValueError(f"init.exec_s ({exec_s}) must fall within the process's life")
        for name, schedule in (("util", self.util), ("mem_util", self.mem_util)):
            times = [at for at, _ in schedule]
            if times != sorted(times) or len(times) != len(set(times)):
                raise ValueError(f"{name} breakpoints must be strictly increasing in time, got {times}")
            for at, fraction in schedule:
                if not 0.0 <= fraction <= 1.0 or at < 0:
                    raise ValueError(f"{name} [{at}, {fraction}]: need at_s >= 0 and 0 <= fraction <= 1")
        if self.gi is not None and self.gpu is None:
            raise ValueError("gi is set but gpu is not")
        self._check_moves()
        return self

    def _check_moves(self) -> None:
        if self.moves and self.gpu is not None:
            raise ValueError(
                "moves: only a CPU-only process moves (gpu is set; its GPU truth is by its container): drop moves, "
                "or gpu"
            )
        before, placement = f"the process's start_s ({self.start_s:g} s)", (self.container, self.cgroup)
        last_s = self.start_s
        for n, move in enumerate(self.moves):
            if move.at_s <= last_s:
                raise ValueError(f"moves.{n}.at_s: {move.at_s:g} s is not after {before}")
            if self.end_s is not None and move.at_s >= self.end_s:
                raise ValueError(
                    f"moves.{n}.at_s: {move.at_s:g} s is not before the process's end_s ({self.end_s:g} s)"
                )
            if (move.container, move.cgroup) == placement:
                where = f"cgroup {move.cgroup}" if move.cgroup else f"container {move.container}"
                where = (
                    where if move.cgroup or move.container else f"its host cgroup (/system.slice/{self.comm}.service)"
                )
                raise ValueError(
                    f"moves.{n}: the process is already in {where} at {move.at_s:g} s (a move names another "
                    "container or cgroup)"
                )
            before, placement, last_s = (
                f"the move before it (moves.{n}, at {move.at_s:g} s)",
                (move.container, move.cgroup),
                move.at_s,
            )
