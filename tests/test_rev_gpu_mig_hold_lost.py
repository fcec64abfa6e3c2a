"""Review of the GPU side (found beside tests/test_rev_gpu_hold_lost.py): a MIG GPU lost for good (no DevicePower
ever again) while attribution holds its energy for dcgm-exporter's window. The MIG hold released a tick not
covered within ``mig_max_wait`` only in a tick of that device (``Hold.release_due`` ran from ``split``), which a
lost GPU never has again: up to ``mig_max_wait`` of energy never reached a process, container or pod total.

Now ``MigAttribution.unanswered`` releases, for a MIG device with no DevicePower, the ticks that have waited
``mig_max_wait``, by their provisional split, as late shares (no watts) and instance energy. The energy processor
counts them differently from the idle hold's: a MIG tick's held energy is in the device's ``active_energy_mj``
since it was measured (only its split waited), an idle-held tick's in neither idle nor active until released.
The share's mode (a MIG one) says which: the processes and instances get it, the device's totals do not again.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.processors.test_idle_energy import energy
from tests.processors.test_mig_window import TICK_MJ, Collected, Node
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.records import DeviceSample


def test_energy_held_for_dcgm_on_a_mig_gpu_lost_for_good_is_released_after_mig_max_wait() -> None:
    node = Node()
    for _ in range(3):
        node.tick([(10, 1), (20, 2)])
    assert node.held == 30_000
    released = 0
    for k in range(1, 40):  # the GPU is down from here on (200 s): a down sample, no DevicePower
        t = node.t_s + 5.0 * k
        time = Timestamp(monotonic_s=t, wall_s=1_767_225_600.0 + t)
        down = DeviceSample(time=time, device_id="G", up=False)
        out = node.proc.process(Batch(time=time, interval_s=5.0, node="n").replace(devices=(down,)))
        released += sum(s.energy_mj for s in out.shares)
    assert released == 30_000


def test_the_energy_processor_bills_it_once_to_the_processes_and_not_again_to_the_device() -> None:
    """MIG held energy is in the device's active total since it was measured: its release for a lost GPU reaches
    the processes (and the instances), lowers the held level, and leaves the device's energy as it was."""
    node = Node()
    totals = energy(SteppedClock())
    for _ in range(3):
        totals.process(node.tick([(10, 1), (20, 2)]))
    before = totals.devices["G"]
    assert (before.energy_mj, before.active_energy_mj, before.unattributed_energy_mj) == (30_000, 30_000, 0)
    for k in range(1, 40):
        t = node.t_s + 5.0 * k
        time = Timestamp(monotonic_s=t, wall_s=1_767_225_600.0 + t)
        down = DeviceSample(time=time, device_id="G", up=False)
        out = totals.process(node.proc.process(Batch(time=time, interval_s=5.0, node="n").replace(devices=(down,))))
    (device,) = out.device_totals
    assert (device.energy_mj, device.active_energy_mj, device.attributed_energy_mj) == (30_000, 30_000, 30_000)
    processes = {t.key: t.energy_mj for t in out.totals if t.scope == "process"}
    instances = {t.key: t.energy_mj for t in out.totals if t.scope == "instance"}
    assert sum(processes.values()) == sum(instances.values()) == 30_000
    last = totals.devices["G"].last
    assert last is not None
    assert last.held_energy_mj == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["up", "collected", "down"]), max_size=40))
def test_every_tick_conserves_through_outages_and_nothing_is_counted_twice(plan: list[str]) -> None:
    """Per tick: answered, Σ shares + (held now − held before) == active (Node.tick checks it); down, Σ shares ==
    held before − held now. Throughout: the device's energy == Σ measured, and its processes' totals +
    unattributed + held == its active energy."""
    node, totals = Node(), energy(SteppedClock())
    measured = 0
    for step in plan:
        if step == "down":
            node.t_s += 5.0
            time = Timestamp(monotonic_s=node.t_s, wall_s=1_767_225_600.0 + node.t_s)
            down = Batch(time=time, interval_s=5.0, node="n").replace(
                devices=(DeviceSample(time=time, device_id="G", up=False),)
            )
            out = totals.process(node.proc.process(down))
            last = totals.devices["G"].last if "G" in totals.devices else None
            held_now = last.held_energy_mj if last is not None else 0
            assert sum(s.energy_mj for s in out.shares) == node.held - held_now
            node.held = held_now
        else:
            collected = Collected({1: 0.5, 2: 1.0}, after_s=node.t_s) if step == "collected" else None
            out = totals.process(node.tick([(10, 1), (20, 2)], collected=collected))
            measured += TICK_MJ
        for device in out.device_totals:
            processes = sum(t.energy_mj for t in out.totals if t.scope == "process")
            assert device.energy_mj == device.active_energy_mj == measured
            assert processes + device.unattributed_energy_mj + node.held == device.active_energy_mj
