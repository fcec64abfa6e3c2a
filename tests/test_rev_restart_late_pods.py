"""Late energy a restored hold releases after a restart must reach the process's container and pod.

Attribution saves the energy it holds (a GPU whose idle is not known yet, ``idle_wait``; a MIG GPU waiting for
dcgm-exporter, ``mig_max_wait``) and releases it after a restart, as late shares of the processes that used it
(df7a11b). The energy processor restores their process series, so the late energy reaches them; but the ``k8s``
processor's memory of who an exited process was (processors/k8s/_exited.py) was not saved: after the restart a
late share of a process that exited before it (or while wattpipe was down) had no Workload, and its container's
and pod's totals missed its energy; where the kernel had given the pid to a process in another pod by then, that
pod got it instead.

The processors are run directly (attribution → k8s → energy, as configs/demo.yaml orders them) on one state
store, checkpointed as the service does at a clean stop (every component's ``snapshot()``, through JSON).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import pytest

from tests.helpers.context import make_context
from tests.processors.test_idle_energy import energy
from tests.processors.test_idle_hold import IDLE_W, at, power, procs
from tests.processors.test_late_shares import k8s_tick
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.records import DevicePower, DeviceSample, HostProcess
from wattpipe.pipeline.state import StateStore
from wattpipe.processors.attribution import AttributionConfig, AttributionProcessor
from wattpipe.processors.energy import EnergyProcessor
from wattpipe.processors.k8s import K8sConfig, K8sProcessor

POD = {10: "uid-a", 11: "uid-b"}  # pod UID of each pid before the restart; pid 11 reused in uid-c after it


def container(pod_uid: str) -> str:
    return pod_uid[-1] * 64


class Wattpipe:
    """One run of attribution → k8s → energy on ``state``."""

    def __init__(self, clock: SteppedClock, state: StateStore) -> None:
        self.clock = clock
        ctx = make_context("attribution", "processor", clock, pipeline="metrics", state=state)
        self.attribution = AttributionProcessor(AttributionConfig(), ctx)
        ctx = make_context("k8s", "processor", clock, pipeline="metrics", state=state)
        self.k8s = K8sProcessor(K8sConfig(api="off"), ctx, env={})
        self.energy: EnergyProcessor = energy(clock, state)  # (started)
        self.attribution.start()
        self.k8s.start()

    def tick(
        self, n: int, powers: Sequence[DevicePower], on_gpu: dict[str, dict[int, float]], pods: dict[int, str]
    ) -> Batch:
        """Tick ``n``: ``on_gpu`` device → {pid: SM utilisation}; ``pods`` pid → pod UID of those in /proc."""
        self.clock.set(at(n).monotonic_s)
        hosts = tuple(
            HostProcess(
                time=at(n),
                pid=pid,
                start_time_ticks=1000 * pid + ord(uid[-1]),
                container_id=container(uid),
                pod_uid=uid,
            )
            for pid, uid in pods.items()
        )
        batch = Batch(time=at(n), interval_s=5.0, node="n").replace(
            device_power=tuple(powers),
            devices=tuple(DeviceSample(time=at(n), device_id=d) for d in on_gpu),
            gpu_processes=tuple(p for d, utils in on_gpu.items() for p in _on(procs(n, utils), d)),
            host_processes=hosts,
        )
        return self.energy.process(self.k8s.process(self.attribution.process(batch)))

    def stop(self, state: StateStore) -> None:
        """A clean stop's last checkpoint: every component that has a ``snapshot()`` (pipeline/runtime.py)."""
        for key, component in (
            ("metrics/attribution", self.attribution),
            ("metrics/k8s", self.k8s),
            ("metrics/energy", self.energy),
        ):
            snapshot = getattr(component, "snapshot", None)
            if snapshot is not None:
                state.put(key, json.loads(json.dumps(snapshot())))
        self.k8s.shutdown()


def _on(samples: Sequence[Any], device_id: str) -> list[Any]:
    return [dataclasses.replace(s, device_id=device_id) for s in samples]


def totals(out: Batch, scope: str, device_id: str = "G") -> dict[str, int]:
    return {t.key: t.energy_mj for t in out.totals if t.scope == scope and t.device_id == device_id}


@pytest.mark.parametrize(
    ("ran", "reused"),
    [
        ("before", False),  # pid 11 exits before the stop, while tick 0's energy is held
        ("downtime", False),  # pid 11 runs until the stop, and exits while wattpipe is down
        ("before", True),  # and after the restart the kernel has given pid 11 to a process on GPU H in pod uid-c
    ],
)
def test_energy_released_after_a_restart_reaches_the_pod_and_container_of_a_process_that_exited(
    ran: str, reused: bool
) -> None:
    clock = SteppedClock()
    state = StateStore(None, clock, "n")
    first = Wattpipe(clock, state)
    # GPU G's idle is not known yet: its energy (500 J a tick, 350 J of it idle at 70 W) is held with its split.
    first.tick(0, [power(0, 500_000, None)], {"G": {10: 0.5, 11: 0.5}}, POD)
    second_split = {10: 0.5, 11: 0.5} if ran == "downtime" else {10: 1.0}
    out = first.tick(1, [power(1, 500_000, None)], {"G": second_split}, {p: POD[p] for p in second_split})
    assert out.device_power[0].held_energy_mj == 1_000_000
    assert sum(totals(out, "pod").values()) == 0  # all held
    first.stop(state)

    again = Wattpipe(clock, state)  # 75 s later, within keep_exited, late_energy_wait and idle_wait
    pods = {10: "uid-a", **({11: "uid-c"} if reused else {})}
    on_gpu: dict[str, dict[int, float]] = {"G": {10: 1.0}, **({"H": {11: 1.0}} if reused else {})}
    again.tick(16, [], on_gpu, pods)  # every counter's baseline: no DevicePower
    h = [dataclasses.replace(power(17, 500_000, IDLE_W), device_id="H")] if reused else []
    out = again.tick(17, [power(17, 500_000, IDLE_W), *h], on_gpu, pods)  # idle known: all held is released

    late_11 = 75_000 if ran == "before" else 150_000  # its shares of the held ticks' 150 J above idle
    processes = totals(out, "process")
    assert processes["11"] == late_11
    assert processes["10"] == 3 * 150_000 - late_11
    (device,) = [d for d in out.device_totals if d.device_id == "G"]
    assert (device.active_energy_mj, device.unattributed_energy_mj) == (3 * 150_000, 0)
    # The pods and containers on G: each exited process's late energy in its own, once; Σ == Σ processes.
    assert totals(out, "pod") == {"uid-a": processes["10"], "uid-b": late_11}
    assert totals(out, "container") == {container("uid-a"): processes["10"], container("uid-b"): late_11}
    if reused:  # the new process's pod has its own energy alone, on H
        assert totals(out, "process", "H") == {"11": 150_000}
        assert totals(out, "pod", "H") == {"uid-c": 150_000}


# --- the k8s processor's section -----------------------------------------------------------------


def k8s_on(clock: SteppedClock, state: StateStore, **options: object) -> K8sProcessor:
    ctx = make_context("k8s", "processor", clock, pipeline="metrics", state=state)
    proc = K8sProcessor(K8sConfig(api="off", **options), ctx, env={})  # type: ignore[arg-type]
    proc.start()
    return proc


def test_exited_processes_are_remembered_across_a_restart_for_keep_exited_downtime_included() -> None:
    """Pid 1 exits before the stop, pid 2 while wattpipe is down; the node reboots meanwhile (the monotonic clock
    starts again): each is forgotten ``keep_exited`` after the tick that found it gone, by the wall clock."""
    clock = SteppedClock()
    state = StateStore(None, clock, "n")
    proc = k8s_on(clock, state, keep_exited=60.0)
    k8s_tick(proc, clock, [1, 2], [1, 2])
    exit_wall_s = clock.wall()
    k8s_tick(proc, clock, [2], [2])  # pid 1 is gone: remembered until 60 s from now
    state.put("metrics/k8s", json.loads(json.dumps(proc.snapshot())))
    clock = SteppedClock(start_wall_s=exit_wall_s + 30.0, start_monotonic_s=7.0)
    proc = k8s_on(clock, state, keep_exited=60.0)
    late_for: list[tuple[float, list[int]]] = []
    while clock.wall() <= exit_wall_s + 95.0:
        wall_s = clock.wall()
        got = k8s_tick(proc, clock, [], [], shares=[1, 2])
        assert all((w.pod_uid, dict(w.extra)["device_id"]) == ("uid-a", "G") for w in got.values())
        late_for.append((wall_s - exit_wall_s, sorted(got)))
    expected = [(float(s), [1, 2]) for s in range(30, 60, 5)] + [(float(s), [2]) for s in range(60, 90, 5)]
    assert late_for == [*expected, (90.0, []), (95.0, [])]  # pid 2 found gone by the restart's first tick (+30 s)


def _saved() -> dict[str, Any]:
    clock = SteppedClock()
    proc = k8s_on(clock, StateStore(None, clock, "n"))
    k8s_tick(proc, clock, [1, 2], [1, 2])
    k8s_tick(proc, clock, [2], [2])
    saved: dict[str, Any] = json.loads(json.dumps(proc.snapshot()))
    assert (len(saved["exited"]["listed"]), len(saved["exited"]["gone"]), saved["seen"]) == (1, 1, [2])
    return saved


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda s: {"processes": [], "devices": {}}, "not a k8s section"),  # another component's
        (lambda s: s["exited"].update(gone={}) or s, "gone is dict"),
        (lambda s: s["exited"]["gone"][0].update(pid="1") or s, "exited process 0: pid '1'"),
        (lambda s: s["exited"]["listed"][0].update(pod_uid=5) or s, "listed process 0: pod_uid 5"),
        (lambda s: s["exited"]["gone"][0].update(extra=[["a"]]) or s, r"extra \[\['a'\]\]"),
        (lambda s: s["exited"]["gone"][0].pop("forget_wall_s") and s, "forget_wall_s None"),
        (lambda s: s.update(seen=["2"]) or s, r"seen \['2'\]"),
    ],
)
def test_a_k8s_section_it_cannot_use_raises_naming_what_and_restores_nothing(edit: Any, named: str) -> None:
    clock = SteppedClock()
    state = StateStore(None, clock, "n")
    state.put("metrics/k8s", edit(_saved()))
    proc = K8sProcessor(
        K8sConfig(api="off"), make_context("k8s", "processor", clock, pipeline="metrics", state=state), env={}
    )
    with pytest.raises(ValueError, match=named):
        proc.start()
    assert proc.snapshot() == {"exited": {"listed": [], "gone": []}, "seen": []}  # the runtime starts it afresh
