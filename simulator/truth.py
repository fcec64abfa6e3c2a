"""The physics the simulator plays, and the ground truth every face is derived from.

A GPU's true power at scenario time ``t`` is ``idle_w + Σ util_p(t)·dynamic_w_p``, capped at ``max_w``;
when capped, every process's dynamic part scales by the same factor. Utilisation schedules, process
lifetimes and live reconfigurations are all step functions, so power is a step function too: it is
built once per GPU over the union of all breakpoints, and energy is its exact integral. Queries are
pure functions of ``t`` (a bisect and a multiply), so any face can ask about any instant, in any order.

Times are scenario seconds (0 = when the node was built); before 0 every GPU idles.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

from simulator._faults import ComputeMode
from simulator._schema_base import MigSpec
from simulator._step import StepFunction
from simulator.hardware import gpu_model_info
from simulator.scenario import Process, Scenario

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

    def alive(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.end_s

    def alive_s(self, t_s: float) -> float:
        """Seconds this process has run by ``t_s``."""
        return max(0.0, min(t_s, self.end_s) - self.start_s)


class _GpuTruth:
    """Step functions over one GPU's breakpoints."""

    def __init__(self, scenario: Scenario, index: int, plans: list[ProcessPlan]) -> None:
        gpu = scenario.gpus[index]
        self.idle_w = gpu.idle_w
        self.epochs = _epochs(scenario, index)
        self.plans = plans
        points = {0.0, *(t for t, _ in self.epochs)}
        for plan in plans:
            points.update(t for t in plan.util.times if math.isfinite(t))
        times = sorted(t for t in points if t >= 0.0)
        self.times = times
        n = len(times)
        power = [0.0] * n
        capped = [0.0] * n
        own: dict[int, list[float]] = {plan.pid: [0.0] * n for plan in plans}
        activity_raw: dict[int | None, list[float]] = {None: [0.0] * n}
        memory: dict[int | None, list[float]] = {None: [0.0] * n}
        live: list[tuple[ProcessPlan, ...]] = []
        for k, t in enumerate(times):
            state = self.state(t)
            running = tuple(plan for plan in plans if plan.alive(t))
            live.append(running)
            utils = [plan.util.at(t) for plan in running]
            raw_w = sum(u * plan.dynamic_w for u, plan in zip(utils, running, strict=True))
            headroom_w = state.max_w - state.idle_w
            scale = headroom_w / raw_w if raw_w > headroom_w else 1.0
            capped[k] = 1.0 if raw_w > headroom_w else 0.0
            power[k] = state.idle_w + raw_w * scale
            for u, plan in zip(utils, running, strict=True):
                own[plan.pid][k] = u * plan.dynamic_w * scale
                memory[None][k] += plan.spec.memory_mib
                if plan.gi is None:
                    activity_raw[None][k] += u
                else:
                    activity_raw.setdefault(plan.gi, [0.0] * n)[k] += u
                    memory.setdefault(plan.gi, [0.0] * n)[k] += plan.spec.memory_mib
            if state.mig is not None:
                total_slices = gpu_model_info(gpu.model).mig_slices
                activity_raw[None][k] = sum(
                    min(1.0, activity_raw[inst.gi][k] if inst.gi in activity_raw else 0.0) * inst.slices / total_slices
                    for inst in state.mig.instances
                )
        self.live = live
        self.power_w = StepFunction(times, power, before=gpu.idle_w)
        self.capped = StepFunction(times, capped)
        self.process_w = {pid: StepFunction(times, values) for pid, values in own.items()}
        # A GPU (instance) cannot be more than fully busy: time-sliced processes share it.
        self.activity = {
            key: StepFunction(times, [min(1.0, v) for v in values]) for key, values in activity_raw.items()
        }
        self.memory_mib = {key: StepFunction(times, values) for key, values in memory.items()}

    def state(self, t_s: float) -> GpuState:
        current = self.epochs[0][1]
        for at_s, state in self.epochs:
            if at_s <= t_s:
                current = state
        return current


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


def _plan(scenario: Scenario, process: Process) -> ProcessPlan:
    end_s = math.inf if process.end_s is None else process.end_s
    dynamic_w = 0.0
    if process.gpu is not None:
        gpu = scenario.gpus[process.gpu]
        epochs = _epochs(scenario, process.gpu)
        start_state = max((e for e in epochs if e[0] <= process.start_s), key=lambda e: e[0])[1]
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
    times = [process.start_s]
    values = [0.0]
    for at_s, fraction in process.util:
        if at_s <= process.start_s:
            values[0] = fraction
        elif at_s < end_s:
            times.append(at_s)
            values.append(fraction)
    if math.isfinite(end_s):
        times.append(end_s)
        values.append(0.0)
    return ProcessPlan(
        pid=process.pid,
        spec=process,
        gpu=process.gpu,
        gi=process.gi,
        dynamic_w=dynamic_w,
        start_s=process.start_s,
        end_s=end_s,
        util=StepFunction(times, values),
    )


class GroundTruth:
    """Exact per-device, per-process, per-container and per-pod truths of a scenario."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.plans: dict[int, ProcessPlan] = {p.pid: _plan(scenario, p) for p in scenario.processes}
        self._gpus = [
            _GpuTruth(scenario, index, [plan for plan in self.plans.values() if plan.gpu == index])
            for index in range(len(scenario.gpus))
        ]
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
        k = max(0, _index(truth.times, t_s))
        live = tuple(plan for plan in truth.live[k] if plan.alive(t_s))
        return live if gi is None else tuple(plan for plan in live if plan.gi == gi)

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

    def container_energy_j(self, container: str, t_s: float) -> float:
        """``container`` is ``namespace/pod/name``."""
        return sum(self.process_energy_j(p.pid, t_s) for p in self.plans.values() if p.spec.container == container)

    def pod_energy_j(self, namespace: str, pod: str, t_s: float) -> float:
        prefix = f"{namespace}/{pod}/"
        return sum(
            self.process_energy_j(p.pid, t_s)
            for p in self.plans.values()
            if p.spec.container is not None and p.spec.container.startswith(prefix)
        )

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
        return self.scenario.cpu.dram_w * t_s


def _index(times: list[float], t_s: float) -> int:
    return bisect_right(times, t_s) - 1


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
