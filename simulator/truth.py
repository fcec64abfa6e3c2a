"""The physics the simulator plays, and the ground truth every face is derived from.

A GPU's true power at scenario time ``t`` is ``idle_w + Σ (util_p(t)·dynamic_w_p + mem_util_p(t)·mem_w_p)``
(watts per unit of SM and of memory utilisation), capped at ``max_w``; when capped, every process's
dynamic part scales by the same factor. Utilisation schedules, process
lifetimes and live reconfigurations are all step functions, so power is a step function too: it is
built once per GPU over the union of all breakpoints, and energy is its exact integral. Queries are
pure functions of ``t`` (a bisect and a multiply), so any face can ask about any instant, in any order.

The build is a sweep over each GPU's breakpoints that keeps the processes alive in each segment, and a
process's own power is kept over its own lifetime only: its cost is the number of (segment, live process)
pairs, so process churn costs what the processes alive at once cost, not processes × breakpoints.

Times are scenario seconds (0 = when the node was built); before 0 every GPU idles.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable
from dataclasses import dataclass

from wattpipe.simulator._faults import ComputeMode
from wattpipe.simulator._schema_base import MigSpec
from wattpipe.simulator._step import StepFunction
from wattpipe.simulator.hardware import gpu_model_info
from wattpipe.simulator.scenario import Process, Scenario

__all__ = ["GpuState", "GroundTruth", "ProcessPlan"]


@dataclass(frozen=True, slots=True)
class GpuState:
    """The settings of one GPU during a configuration epoch."""

    idle_w: float
    max_w: float
    compute_mode: ComputeMode
    mig: MigSpec | None


@dataclass(frozen=True, slots=True)
class ProcessPlan:
    """A process as the simulator runs it: placement, effective lifetime, resolved power."""

    pid: int
    spec: Process
    gpu: int | None
    gi: int | None
    dynamic_w: float
    start_s: float
    end_s: float  # math.inf: runs to the end; earlier than spec.end_s when a reconfiguration kills it
    util: StepFunction  # SM utilisation (fraction of its GPU or GPU instance), 0 outside its life
    mem_w: float  # W per unit of memory utilisation
    mem_util: StepFunction  # memory utilisation (0–1), 0 outside its life

    def alive(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.end_s

    def alive_s(self, t_s: float) -> float:
        """Seconds this process has run by ``t_s``."""
        return max(0.0, min(t_s, self.end_s) - self.start_s)


class _GpuTruth:
    """Step functions over one GPU's breakpoints, built by one sweep over them.

    The sweep keeps the processes alive in each segment (in scenario order) and touches only those, so
    building costs O(Σ over segments of the processes alive in it), not O(processes × breakpoints): a
    process's own power is stored over its own lifetime only (a step function from its start to its end).
    """

    # long: one sweep whose dozen running accumulators each breakpoint updates; split, they'd travel.
    def __init__(
        self, scenario: Scenario, index: int, plans: list[ProcessPlan], epochs: list[tuple[float, GpuState]]
    ) -> None:
        gpu = scenario.gpus[index]
        self.idle_w = gpu.idle_w
        self.epochs = epochs
        self._epoch_times = [at_s for at_s, _ in epochs]
        self.plans = plans
        self._order = {plan.pid: i for i, plan in enumerate(plans)}
        points = {0.0, *self._epoch_times}
        for plan in plans:
            points.update(t for t in plan.util.times if math.isfinite(t))
            points.update(t for t in plan.mem_util.times if math.isfinite(t))
        times = sorted(t for t in points if t >= 0.0)
        self.times = times
        n = len(times)
        # Every start, (finite) end and utilisation change is a breakpoint: process i is alive exactly at
        # breakpoints first[i] <= k < its end's, and its utilisation changes only at its own breakpoints.
        position = {t: k for k, t in enumerate(times)}
        starting: dict[int, list[int]] = {}
        ending: dict[int, list[int]] = {}
        changing: dict[int, list[tuple[int, float]]] = {}
        mem_changing: dict[int, list[tuple[int, float]]] = {}
        first = [0] * len(plans)
        for i, plan in enumerate(plans):
            first[i] = position[plan.start_s]
            starting.setdefault(first[i], []).append(i)
            if math.isfinite(plan.end_s):
                ending.setdefault(position[plan.end_s], []).append(i)
            for at_s, fraction in zip(plan.util.times, plan.util.values, strict=True):
                if at_s < plan.end_s:
                    changing.setdefault(position[at_s], []).append((i, fraction))
            for at_s, fraction in zip(plan.mem_util.times, plan.mem_util.values, strict=True):
                if at_s < plan.end_s:
                    mem_changing.setdefault(position[at_s], []).append((i, fraction))
        dynamic_w = [plan.dynamic_w for plan in plans]
        mem_w = [plan.mem_w for plan in plans]
        memory_mib = [plan.spec.memory_mib for plan in plans]
        mig_plans = any(plan.gi is not None for plan in plans)
        util = [0.0] * len(plans)  # each process's utilisation at the current breakpoint
        mem = [0.0] * len(plans)  # … and its memory utilisation
        util_w = [0.0] * len(plans)  # … times their watts per unit: its dynamic power
        own: list[list[float]] = [[] for _ in plans]  # process i's power at breakpoints first[i], first[i]+1, …
        power = [0.0] * n
        capped = [0.0] * n
        activity_raw: dict[int | None, list[float]] = {None: [0.0] * n}
        memory: dict[int | None, list[float]] = {None: [0.0] * n}
        gpu_activity, gpu_memory = activity_raw[None], memory[None]
        total_slices = gpu_model_info(gpu.model).mig_slices
        live: list[tuple[ProcessPlan, ...]] = []
        alive: list[int] = []  # indices into plans, ascending: scenario order
        running: tuple[ProcessPlan, ...] = ()
        used_mib = 0.0
        for k, t in enumerate(times):
            if k in ending or k in starting:
                for i in ending.get(k, ()):
                    del alive[bisect_left(alive, i)]
                for i in starting.get(k, ()):
                    insort(alive, i)
                running = tuple(plans[i] for i in alive)
                used_mib = 0.0
                for i in alive:
                    used_mib += memory_mib[i]
            for i, fraction in changing.get(k, ()):
                util[i] = fraction
                util_w[i] = fraction * dynamic_w[i] + mem[i] * mem_w[i]
            for i, fraction in mem_changing.get(k, ()):
                # (Without memory power this adds 0.0 to the SM part: every older scenario's numbers stay.)
                mem[i] = fraction
                util_w[i] = util[i] * dynamic_w[i] + fraction * mem_w[i]
            live.append(running)  # consecutive segments with the same processes share one tuple
            state = self.state(t)
            raw = [util_w[i] for i in alive]
            raw_w = sum(raw)
            headroom_w = state.max_w - state.idle_w
            scale = headroom_w / raw_w if raw_w > headroom_w else 1.0
            capped[k] = 1.0 if raw_w > headroom_w else 0.0
            power[k] = state.idle_w + raw_w * scale
            if scale == 1.0:  # x * 1.0 is x
                for x, i in zip(raw, alive, strict=True):
                    own[i].append(x)
            else:
                for x, i in zip(raw, alive, strict=True):
                    own[i].append(x * scale)
            gpu_memory[k] = used_mib
            busy = 0.0
            if not mig_plans:
                for i in alive:
                    busy += util[i]
            else:
                for i in alive:
                    gi = plans[i].gi
                    if gi is None:
                        busy += util[i]
                    else:
                        if gi not in activity_raw:  # not setdefault: its default would be built every time
                            activity_raw[gi], memory[gi] = [0.0] * n, [0.0] * n
                        activity_raw[gi][k] += util[i]
                        memory[gi][k] += memory_mib[i]
            gpu_activity[k] = busy
            if state.mig is not None:
                gpu_activity[k] = sum(
                    min(1.0, activity_raw[inst.gi][k] if inst.gi in activity_raw else 0.0) * inst.slices / total_slices
                    for inst in state.mig.instances
                )
        self.live = live
        self.power_w = StepFunction(times, power, before=gpu.idle_w)
        self.capped = StepFunction(times, capped)
        # Zero before its start and after its end, so the integral over its lifetime is the one over all time.
        self.process_w: dict[int, StepFunction] = {}
        for i, plan in enumerate(plans):
            values = own[i]
            stop = first[i] + len(values)
            if stop < n:  # ended: 0 from its end on
                values.append(0.0)
                stop += 1
            self.process_w[plan.pid] = StepFunction(times[first[i] : stop], values)
        # A GPU (instance) cannot be more than fully busy: time-sliced processes share it.
        self.activity = {
            key: StepFunction(times, [min(1.0, v) for v in values]) for key, values in activity_raw.items()
        }
        self.memory_mib = {key: StepFunction(times, values) for key, values in memory.items()}

    def state(self, t_s: float) -> GpuState:
        """The last configuration epoch that began at or before ``t_s``."""
        k = bisect_right(self._epoch_times, t_s) - 1
        return self.epochs[k][1] if k >= 0 and not math.isnan(t_s) else self.epochs[0][1]

    def segment(self, t_s: float) -> int:
        """The index of the last breakpoint at or before ``t_s`` (0 before the first)."""
        return max(0, bisect_right(self.times, t_s) - 1)

    def overlapping(self, t0_s: float, t1_s: float) -> tuple[ProcessPlan, ...]:
        """Processes with ``start_s < t1_s`` and ``end_s > t0_s``, in scenario order.

        For ``t0_s < t1_s`` these are the processes alive at some instant of ``[t0_s, t1_s)``: each is in the
        live set of a segment from the one holding ``t0_s`` to the last one starting before ``t1_s``.
        """
        times = self.times
        if t1_s <= times[0]:
            return ()  # nobody starts before 0
        last = bisect_left(times, t1_s) - 1
        first = max(0, min(bisect_right(times, t0_s) - 1, last))
        live = self.live
        candidates: tuple[ProcessPlan, ...] | list[ProcessPlan] = live[first]
        if last > first:
            seen: dict[int, ProcessPlan] = {}
            previous = None
            for k in range(first, last + 1):
                if live[k] is not previous:
                    previous = live[k]
                    for plan in previous:
                        seen[plan.pid] = plan
            candidates = sorted(seen.values(), key=lambda plan: self._order[plan.pid])
        return tuple(plan for plan in candidates if plan.start_s < t1_s and plan.end_s > t0_s)


def _epochs(scenario: Scenario, index: int) -> list[tuple[float, GpuState]]:
    gpu = scenario.gpus[index]
    state = GpuState(idle_w=gpu.idle_w, max_w=gpu.max_w, compute_mode=gpu.compute_mode, mig=gpu.mig)
    epochs = [(-math.inf, state)]
    for at_s, change in scenario.gpu_changes(index):
        fields = change.model_fields_set
        state = GpuState(
            idle_w=state.idle_w,
            max_w=change.max_w if change.max_w is not None else state.max_w,
            compute_mode=change.compute_mode if change.compute_mode is not None else state.compute_mode,
            mig=change.mig if "mig" in fields else state.mig,
        )
        epochs.append((at_s, state))
    return epochs


def _placement_valid(state: GpuState, gi: int | None, profile: str | None) -> bool:
    if state.mig is None:
        return gi is None
    instance = state.mig.instance(gi) if gi is not None else None
    return instance is not None and instance.profile == profile


def _plan(scenario: Scenario, process: Process, epochs_by_gpu: list[list[tuple[float, GpuState]]]) -> ProcessPlan:
    end_s = math.inf if process.end_s is None else process.end_s
    dynamic_w = 0.0
    if process.gpu is not None:
        gpu = scenario.gpus[process.gpu]
        epochs = epochs_by_gpu[process.gpu]
        # The first epoch of the latest start at or before the process's start (epochs[0] starts at -inf).
        start_at, start_state = epochs[0]
        for at_s, state in epochs:
            if start_at < at_s <= process.start_s:
                start_at, start_state = at_s, state
        profile = None
        if start_state.mig is not None and process.gi is not None:
            instance = start_state.mig.instance(process.gi)
            profile = instance.profile if instance else None
        # A reconfiguration that removes the process's GPU instance (or turns MIG on or off) needs the
        # GPU idle: the process ends there.
        for at_s, state in epochs:
            if process.start_s < at_s < end_s and not _placement_valid(state, process.gi, profile):
                end_s = at_s
                break
        headroom_w = gpu.max_w - gpu.idle_w
        if process.dynamic_w is not None:
            dynamic_w = process.dynamic_w
        elif profile is not None:
            # A MIG instance has only its slices' share of the GPU's engines to keep busy.
            dynamic_w = headroom_w * int(profile.split("g")[0]) / gpu_model_info(gpu.model).mig_slices
        else:
            dynamic_w = headroom_w
    return ProcessPlan(
        pid=process.pid,
        spec=process,
        gpu=process.gpu,
        gi=process.gi,
        dynamic_w=dynamic_w,
        start_s=process.start_s,
        end_s=end_s,
        util=_schedule(process.util, process.start_s, end_s),
        mem_w=process.mem_w,
        mem_util=_schedule(process.mem_util, process.start_s, end_s),
    )


def _schedule(schedule: list[tuple[float, float]], start_s: float, end_s: float) -> StepFunction:
    """A utilisation schedule as a step function over the process's life (0 before and after it)."""
    times = [start_s]
    values = [0.0]
    for at_s, fraction in schedule:
        if at_s <= start_s:
            values[0] = fraction
        elif at_s < end_s:
            times.append(at_s)
            values.append(fraction)
    if math.isfinite(end_s):
        times.append(end_s)
        values.append(0.0)
    return StepFunction(times, values)


class GroundTruth:
    """Exact per-device, per-process, per-container and per-pod truths of a scenario."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        epochs = [_epochs(scenario, index) for index in range(len(scenario.gpus))]
        self.plans: dict[int, ProcessPlan] = {p.pid: _plan(scenario, p, epochs) for p in scenario.processes}
        by_gpu: list[list[ProcessPlan]] = [[] for _ in scenario.gpus]
        # Scenario order within each group, as the sums over them have always been taken.
        self._by_container: dict[str, list[ProcessPlan]] = {}
        self._by_pod: dict[str, list[ProcessPlan]] = {}  # keyed "namespace/pod/"
        for plan in self.plans.values():
            if plan.gpu is not None:
                by_gpu[plan.gpu].append(plan)
            container = plan.spec.container
            if container is not None:
                self._by_container.setdefault(container, []).append(plan)
                # A container reference is exactly "namespace/pod/name" (the scenario validates it).
                self._by_pod.setdefault(container[: container.rindex("/") + 1], []).append(plan)
        self._gpus = [_GpuTruth(scenario, index, by_gpu[index], epochs[index]) for index in range(len(scenario.gpus))]
        self._cpu_busy_cores = _cpu_busy(self.plans.values())

    # --- devices ---------------------------------------------------------------------------------

    @property
    def gpu_count(self) -> int:
        return len(self._gpus)

    def gpu_state(self, gpu: int, t_s: float) -> GpuState:
        return self._gpus[gpu].state(t_s)

    def device_power_w(self, gpu: int, t_s: float) -> float:
        """Instantaneous true power."""
        return self._gpus[gpu].power_w.at(t_s)

    def device_energy_j(self, gpu: int, t_s: float) -> float:
        """True energy from scenario start to ``t_s`` (negative before the start: the GPU idled)."""
        return self._gpus[gpu].power_w.integral(t_s)

    def device_energy_between_j(self, gpu: int, t0_s: float, t1_s: float) -> float:
        return self._gpus[gpu].power_w.integral_between(t0_s, t1_s)

    def device_average_power_w(self, gpu: int, t_s: float, window_s: float = 1.0) -> float:
        """Mean power over ``[t_s - window_s, t_s]``: what a 1-second-averaging sensor reads."""
        return self._gpus[gpu].power_w.mean(t_s - window_s, t_s)

    def device_capped_s(self, gpu: int, t_s: float) -> float:
        """Seconds since the start during which the power cap throttled the GPU."""
        return max(0.0, self._gpus[gpu].capped.integral(t_s))

    def activity(self, gpu: int, gi: int | None, t0_s: float, t1_s: float) -> float:
        """Mean engine activity (0–1) of a GPU (``gi`` None) or a GPU instance over a window.

        An instance's activity is normalised to the instance, like DCGM's GR_ENGINE_ACTIVE: a busy
        1g instance reads 1.0. A MIG GPU's own activity weighs its instances by compute slices.
        """
        step = self._gpus[gpu].activity.get(gi)
        return 0.0 if step is None else max(0.0, step.mean(t0_s, t1_s))

    def memory_used_mib(self, gpu: int, t_s: float, gi: int | None = None) -> float:
        step = self._gpus[gpu].memory_mib.get(gi)
        return 0.0 if step is None else step.at(t_s)

    def gpu_plans(self, gpu: int) -> list[ProcessPlan]:
        """Every process that ever runs on ``gpu``, in scenario order."""
        return self._gpus[gpu].plans

    def running(self, gpu: int, t_s: float, gi: int | None = None) -> tuple[ProcessPlan, ...]:
        """Processes alive on a GPU (or one of its instances) at ``t_s``, in scenario order."""
        truth = self._gpus[gpu]
        live = tuple(plan for plan in truth.live[truth.segment(t_s)] if plan.alive(t_s))
        return live if gi is None else tuple(plan for plan in live if plan.gi == gi)

    def running_between(self, gpu: int, t0_s: float, t1_s: float) -> tuple[ProcessPlan, ...]:
        """Processes of a GPU with ``start_s < t1_s`` and ``end_s > t0_s`` (alive at some instant of
        ``[t0_s, t1_s)``), in scenario order. O(log breakpoints + processes alive in the window)."""
        return self._gpus[gpu].overlapping(t0_s, t1_s)

    # --- consumers -------------------------------------------------------------------------------

    def process_energy_j(self, pid: int, t_s: float) -> float:
        """True GPU energy of a process up to ``t_s``: the integral of its own dynamic part."""
        plan = self.plans[pid]
        if plan.gpu is None:
            return 0.0
        return max(0.0, self._gpus[plan.gpu].process_w[pid].integral(t_s))

    def process_power_w(self, pid: int, t_s: float) -> float:
        plan = self.plans[pid]
        return 0.0 if plan.gpu is None else self._gpus[plan.gpu].process_w[pid].at(t_s)

    def process_util(self, pid: int, t0_s: float, t1_s: float) -> float:
        """A process's mean SM utilisation over a window (uncapped, fraction of its GPU or instance)."""
        return self.plans[pid].util.mean(t0_s, t1_s)

    def process_mem_util(self, pid: int, t0_s: float, t1_s: float) -> float:
        """A process's mean memory utilisation over a window (0–1)."""
        return self.plans[pid].mem_util.mean(t0_s, t1_s)

    def container_energy_j(self, container: str, t_s: float) -> float:
        """``container`` is ``namespace/pod/name``."""
        return sum(self.process_energy_j(p.pid, t_s) for p in self._by_container.get(container, ()))

    def pod_energy_j(self, namespace: str, pod: str, t_s: float) -> float:
        return sum(self.process_energy_j(p.pid, t_s) for p in self.pod_plans(namespace, pod))

    def pod_plans(self, namespace: str, pod: str) -> list[ProcessPlan]:
        """The processes of a pod's containers, in scenario order."""
        return list(self._by_pod.get(f"{namespace}/{pod}/", ()))

    # --- CPU -------------------------------------------------------------------------------------

    def process_cpu_s(self, pid: int, t_s: float) -> float:
        plan = self.plans[pid]
        return plan.spec.cpu_cores * plan.alive_s(t_s)

    def cpu_busy_cores(self, t_s: float) -> float:
        return self._cpu_busy_cores.at(t_s)

    def cpu_busy_core_s(self, t_s: float) -> float:
        return max(0.0, self._cpu_busy_cores.integral(t_s))

    def cpu_package_energy_j(self, package: int, t_s: float) -> float:
        """RAPL package energy since the scenario start (negative before: the host idled)."""
        cpu = self.scenario.cpu
        share = 1.0 / cpu.packages
        return cpu.idle_w * share * t_s + cpu.w_per_core * share * self._cpu_busy_cores.integral(t_s)

    def cpu_dram_energy_j(self, package: int, t_s: float) -> float:
        cpu = self.scenario.cpu
        if not cpu.dram_w_per_core:
            return cpu.dram_w * t_s
        return cpu.dram_w * t_s + cpu.dram_w_per_core / cpu.packages * self._cpu_busy_cores.integral(t_s)


def _cpu_busy(plans: Iterable[ProcessPlan]) -> StepFunction:
    deltas: dict[float, float] = {0.0: 0.0}
    for plan in plans:
        if plan.spec.cpu_cores <= 0:
            continue
        deltas[plan.start_s] = deltas.get(plan.start_s, 0.0) + plan.spec.cpu_cores
        if math.isfinite(plan.end_s):
            deltas[plan.end_s] = deltas.get(plan.end_s, 0.0) - plan.spec.cpu_cores
    times = sorted(deltas)
    values: list[float] = []
    busy = 0.0
    for t in times:
        busy += deltas[t]
        values.append(max(0.0, busy))
    return StepFunction(times, values)
