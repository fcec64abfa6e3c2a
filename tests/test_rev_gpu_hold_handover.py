"""Review of the GPU side: energy a MIG GPU held, released in the tick it stops being MIG, when that tick is
itself held by the idle hold (idle not known yet). Over every tick, Σ shares + Σ idle + held at the end
must equal Σ energy: the MIG-held energy must not vanish into the idle hold's zeroed shares."""

from __future__ import annotations

import dataclasses

from tests.processors.test_mig_window import TICK_MJ, Node, _batch


def test_mig_held_energy_released_into_an_idle_held_tick_is_not_lost() -> None:
    node = Node()
    both = [(10, 1), (20, 2)]
    out = node.proc.process(_batch(5.0, both, {1: 1.0, 2: 0.0}, None, mig=True))
    assert out.device_power[0].held_energy_mj == TICK_MJ  # the MIG hold waits for dcgm-exporter's window
    # MIG switched off; idle is not known yet and may be learned: this tick is one the idle hold keeps.
    batch = _batch(10.0, [(10, None), (20, None)], {}, None, mig=False)
    (power,) = batch.device_power
    pending = dataclasses.replace(power, idle_w=None, idle_pending=True)
    out = node.proc.process(batch.replace(device_power=(pending,), mig_activity=()))
    (after,) = out.device_power
    billed = sum(s.energy_mj for s in out.shares) + after.idle_energy_mj
    assert billed + after.held_energy_mj == 2 * TICK_MJ  # the first tick's energy and this one's
