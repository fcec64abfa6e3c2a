"""cpu_attribution across a restart: what its state-file section keeps (zones, series, the idle mode's learned
idles), all or nothing, and the series' labels until the k8s processor names their pods again."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tests.helpers.context import make_context
from tests.processors.test_cpu_attribution import Node, step
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.records import Workload
from wattpipe.pipeline.state import StateStore
from wattpipe.processors.cpu_attribution import CpuAttributionConfig, CpuAttributionProcessor

KEY = "metrics/cpu_attribution"


def started(store: StateStore, node_name: str = "n1", **options: object) -> CpuAttributionProcessor:
    ctx = make_context("cpu_attribution", clock=store.clock, pipeline="metrics", state=store, node_name=node_name)
    proc = CpuAttributionProcessor(CpuAttributionConfig(**options), ctx)
    proc.start()
    return proc


def saved(proc: CpuAttributionProcessor, store: StateStore) -> StateStore:
    """``proc``'s section written to the state file and read back, as a restart reads it."""
    store.put(KEY, proc.snapshot())
    assert store.save()
    reloaded = StateStore(store.path, store.clock, store.node_name)
    reloaded.load()
    return reloaded


def learning_ticks(proc: CpuAttributionProcessor, node: Node, ticks: int, *, varied: bool = True) -> Batch:
    """Ticks of a package drawing 40 W idle + 150 W × the usage ratio (varied: between 10 % and 40 %)."""
    out = None
    for i in range(ticks):
        ratio = (0.1, 0.25, 0.4, 0.2)[i % 4] if varied else 0.25
        node.spend("intel-rapl:0", round((40.0 + 150.0 * ratio) * 5 * 1000))
        node.total_s += 10.0
        node.active_s += 10.0 * ratio
        node.run(80, 10.0 * ratio)
        out = step(proc, node)
    assert out is not None
    return out


def learned(tmp_path: Path) -> tuple[Node, StateStore, CpuAttributionProcessor]:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(80)
    store = StateStore(tmp_path / "s.json", node.clock, "n1")
    proc = started(store, mode="idle")
    step(proc, node)
    (power,) = learning_ticks(proc, node, 20).device_power
    assert (power.idle_source, power.idle_w) == ("regression", pytest.approx(40.0, abs=0.01))
    return node, store, proc


def test_a_restart_keeps_the_learned_zone_idle_while_the_load_no_longer_varies(tmp_path: Path) -> None:
    node, store, proc = learned(tmp_path)
    again = started(saved(proc, store), mode="idle")
    step(again, node)  # a baseline: the counters' first reading since the restart
    for _ in range(2):  # a steady load: no new fit can pass, the restored one is used (and saved again)
        (power,) = learning_ticks(again, node, 15, varied=False).device_power
        assert (power.idle_source, power.idle_w) == ("regression", pytest.approx(40.0, abs=0.01))
        assert power.active_w == pytest.approx(150.0 * 0.25, abs=0.01)
        again = started(saved(again, store), mode="idle")
        step(again, node)


def test_a_saved_idle_of_another_node_or_zone_type_or_a_malformed_one_is_reported_and_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node, store, proc = learned(tmp_path)
    store = saved(proc, store)
    caplog.set_level(logging.WARNING)
    other = started(store, node_name="elsewhere", mode="idle")
    assert "elsewhere" in caplog.text
    assert "n1" in caplog.text
    step(other, node)
    (power,) = learning_ticks(other, node, 1, varied=False).device_power
    assert power.idle_source is None  # by the usage ratio
    assert other.zone_totals["intel-rapl:0"].energy_mj > 0  # the totals are this process's still

    caplog.clear()
    section = json.loads(json.dumps(proc.snapshot()))
    fits = section["idle_fits"]["zones"]
    fits["intel-rapl:1"] = {"zone": "package", "idle_w": "forty"}
    fits["intel-rapl:2"] = {"zone": "package", "idle_w": -3.0}
    store.put(KEY, section)
    again = started(store, mode="idle")
    assert "intel-rapl:1" in caplog.text
    assert "intel-rapl:2" in caplog.text
    node.zones["intel-rapl:1"] = ("dram", 0, 0, 0)  # a zone of another type at a path a saved fit names
    fits["intel-rapl:1"] = {"zone": "package", "idle_w": 10.0, "uncertainty_w": None}
    del fits["intel-rapl:2"]
    store.put(KEY, section)
    caplog.clear()
    again = started(store, mode="idle")
    step(again, node)
    node.spend("intel-rapl:1", 5_000)
    powers = {p.device_id: p for p in learning_ticks(again, node, 1, varied=False).device_power}
    assert (powers["intel-rapl:0"].idle_source, powers["intel-rapl:1"].idle_source) == ("regression", None)
    assert "intel-rapl:1" in caplog.text
    assert "dram" in caplog.text


def test_a_bad_process_row_restores_nothing_of_the_section(tmp_path: Path) -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(60, container_id="c6", pod_uid="p6")
    node.spawn(61)
    store = StateStore(tmp_path / "s.json", node.clock, "n1")
    proc = started(store)
    step(proc, node)
    node.half_busy("intel-rapl:0", 20_000)
    node.run(60, 2.0)
    node.run(61, 3.0)
    step(proc, node)
    store = saved(proc, store)
    section = store.section(KEY)
    assert section is not None
    del section["processes"][-1]["energy_mj"]  # the first row is good: it must not be kept either
    again = CpuAttributionProcessor(
        CpuAttributionConfig(), make_context("cpu_attribution", clock=node.clock, pipeline="metrics", state=store)
    )
    with pytest.raises(KeyError):
        again.start()
    assert (again.zone_totals, again.series.processes, again.series.groups) == ({}, {}, {})


def test_restored_series_keep_their_pod_names_until_the_k8s_processor_names_them_again(tmp_path: Path) -> None:
    node = Node(zones={"intel-rapl:0": ("package", 0, 0, 0)})
    node.spawn(60, container_id="c6", pod_uid="p6")
    roster = (
        Workload(time=node.clock.now(), pid=None, container_id="c6", container_name="web", pod_uid="p6",
                 pod_name="shop", pod_namespace="prod", listed="api"),
        Workload(time=node.clock.now(), pid=None, pod_uid="p6", pod_name="shop", pod_namespace="prod", listed="api"),
    )  # fmt: skip
    store = StateStore(tmp_path / "s.json", node.clock, "n1")
    proc = started(store)

    def tick(p: CpuAttributionProcessor, named: bool) -> dict[tuple[str, str, str], dict[str, str]]:
        node.half_busy("intel-rapl:0", 10_000)
        node.run(60, 1.0)
        out = p.process(node.batch().replace(workloads=roster if named else ()))
        node.clock.advance(5.0)
        return {(t.scope, t.key, t.device_id): dict(t.extra) for t in out.totals}

    tick(proc, True)
    before = tick(proc, True)
    assert before[("container", "c6", "cpu:package")]["container_name"] == "web"
    assert before[("process", "60", "cpu:package")]["pod_name"] == "shop"
    again = started(saved(proc, store))
    for named in (False, False, False, True, False):  # the k8s cache not synced yet; then synced
        assert tick(again, named) == before


def test_a_path_that_reads_another_zone_type_after_the_restart_starts_its_totals_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before the restart intel-rapl:0:0 was the core zone; after it (a kernel or firmware update that
    # enumerates the subzones in another order, DRAM RAPL switched on) the same path is DRAM. Its restored
    # 10 J of core energy must not go on as DRAM's total, nor DRAM's energy be exported under zone="core".
    node = Node(zones={"intel-rapl:0:0": ("core", 0, 0, 0)})
    node.spawn(80)
    store = StateStore(tmp_path / "s.json", node.clock, "n1")
    proc = started(store)
    step(proc, node)
    node.half_busy("intel-rapl:0:0", 10_000)
    node.run(80, 5.0)
    (before,) = step(proc, node).device_totals
    assert (before.device_name, before.energy_mj) == ("core", 10_000)

    caplog.set_level(logging.WARNING)
    again = started(saved(proc, store))
    node.zones["intel-rapl:0:0"] = ("dram", 0, 0, 1)  # after the reboot: another zone, its counter from 0
    step(again, node)  # a baseline
    node.half_busy("intel-rapl:0:0", 3_000)
    node.run(80, 5.0)
    out = step(again, node)
    (totals,) = out.device_totals
    assert (totals.device_name, dict(totals.extra)["zone"]) == ("dram", "dram")
    assert (totals.energy_mj, totals.active_energy_mj) == (3_000, 1_500)
    assert totals.start is not None
    assert totals.start.wall_s > before.time.wall_s  # a new series: its own start
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("intel-rapl:0:0 reads as dram now, core in the state file" in m for m in warned)
