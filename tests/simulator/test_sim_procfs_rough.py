"""/proc as rough as the kernel's where CPU attribution depends on it: utime and stime truncated to whole ticks
apart (``user_share``), and processes that move to another cgroup without an exec (``moves``), with the truth
billing each container for the time the process was in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from wattpipe import simulator
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.simulator.cpu_truth import CpuTruth
from wattpipe.simulator.fake_host import ProcfsWriter, cgroup_path
from wattpipe.simulator.scenario import ScenarioError, parse_scenario


def _data(**process: Any) -> dict[str, Any]:
    return {
        "node": {"uptime_s": 100},
        "pods": [
            {"name": "a", "namespace": "ns", "containers": [{"name": "main"}]},
            {"name": "b", "namespace": "ns", "containers": [{"name": "main"}, {"name": "side"}]},
        ],
        "processes": [{"pid": 500, "comm": "worker", "container": "ns/a/main", "cpu_cores": 0.5, **process}],
        "cpu": {"packages": 1, "cores": 8, "idle_w": 40, "w_per_core": 10},
    }


def _utime_stime(root: Path, pid: int) -> tuple[int, int]:
    fields = (root / "proc" / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])  # the 14th and 15th fields


def test_utime_and_stime_are_each_truncated_to_whole_ticks(tmp_path: Path) -> None:
    """0.5 cores for 12.5 s is 625 ticks; at the default 90 % user, 562.5 + 62.5: the kernel writes 562 and 62
    (fs/proc/array.c truncates each), 624 in all, where one truncation of the sum gave 625."""
    clock = SteppedClock()
    writer = ProcfsWriter(simulator.build(parse_scenario(_data()), clock), tmp_path)
    clock.advance(12.5)
    writer.refresh()
    assert _utime_stime(tmp_path, 500) == (562, 62)
    clock.advance(0.005)  # 625.25 ticks: 562.725 and 62.525
    writer.refresh()
    assert _utime_stime(tmp_path, 500) == (562, 62)


def test_a_process_s_user_share_splits_its_time(tmp_path: Path) -> None:
    clock = SteppedClock()
    writer = ProcfsWriter(simulator.build(parse_scenario(_data(user_share=0.3)), clock), tmp_path)
    clock.advance(10.0)  # 500 ticks: 150 user, 350 system, exactly (no float rounding takes one off)
    writer.refresh()
    assert _utime_stime(tmp_path, 500) == (150, 350)


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_a_user_share_outside_0_to_1_is_refused(share: float) -> None:
    with pytest.raises(ScenarioError, match=r"processes\.0\.user_share"):
        parse_scenario(_data(user_share=share))


def test_a_moved_process_shows_its_new_cgroup_and_grows_its_usage(tmp_path: Path) -> None:
    """Moved from ns/a/main to ns/b/side at 20 s, then to a host scope at 40 s: /proc/<pid>/cgroup names where it
    is; each cgroup's cpu.stat keeps what it ran there (0.5 cores × 20 s = 10 s each)."""
    moves = [{"at_s": 20, "container": "ns/b/side"}, {"at_s": 40, "cgroup": "/system.slice/run-r1.scope"}]
    scenario = parse_scenario(_data(moves=moves))
    clock = SteppedClock()
    writer = ProcfsWriter(simulator.build(scenario, clock), tmp_path, cgroups=True)
    spec = scenario.processes[0]
    paths = [cgroup_path(scenario, spec, t) for t in (0.0, 20.0, 40.0)]
    assert paths[0].endswith(".scope")
    assert paths[1].endswith(".scope")
    assert paths[0] != paths[1]
    assert paths[2] == "/system.slice/run-r1.scope"
    assert cgroup_path(scenario, spec) == paths[0]  # no time: where it starts
    seen = []
    for t_s in (10.0, 25.0, 50.0):
        clock.advance(t_s - writer.node.t_s())
        writer.refresh()
        seen.append((tmp_path / "proc" / "500" / "cgroup").read_text())
    assert seen == [f"0::{path}\n" for path in paths]

    def usage_s(path: str) -> float:
        text = (tmp_path / "sys" / "fs" / "cgroup" / path.lstrip("/") / "cpu.stat").read_text()
        return int(text.split()[1]) / 1e6

    assert [usage_s(path) for path in paths] == pytest.approx([10.0, 10.0, 5.0])
    assert usage_s("/") == pytest.approx(25.0)


def test_the_truth_bills_each_container_for_the_time_the_process_was_in_it() -> None:
    moves = [{"at_s": 20, "container": "ns/b/side"}, {"at_s": 40}]  # then a host process
    truth = CpuTruth(simulator.build(parse_scenario(_data(moves=moves)), SteppedClock()).truth)
    joules_per_s = 10 * 0.5  # w_per_core × cores
    assert truth.container_energy_j("ns/a/main", 0, 60) == pytest.approx(20 * joules_per_s)
    assert truth.container_energy_j("ns/b/side", 10, 30) == pytest.approx(10 * joules_per_s)
    assert truth.container_energy_j("ns/b/main", 0, 60) == 0.0
    assert truth.pod_energy_j("ns", "b", 0, 60) == pytest.approx(20 * joules_per_s)
    assert truth.process_energy_j(500, 0, 60) == pytest.approx(60 * joules_per_s)  # the process's own: all of it


@pytest.mark.parametrize(
    ("process", "message"),
    [
        # Each names the move, its time and the bound it breaks, not the whole list against a (start, end) pair.
        (
            {"moves": [{"at_s": 30, "cgroup": "/a"}, {"at_s": 20}]},
            r"processes\.0: .*moves\.1\.at_s: 20 s is not after the move before it \(moves\.0, at 30 s\)",
        ),
        ({"end_s": 10, "moves": [{"at_s": 20}]}, r"moves\.0\.at_s: 20 s is not before the process's end_s \(10 s\)"),
        ({"start_s": 30, "moves": [{"at_s": 20}]}, r"moves\.0\.at_s: 20 s is not after the process's start_s \(30 s\)"),
        # A move to where the process already is changes nothing: a slip (the container it meant misspelt as its own).
        (
            {"moves": [{"at_s": 5, "container": "ns/a/main"}]},
            r"moves\.0: the process is already in container ns/a/main at 5 s \(a move names another container or cgroup\)",
        ),
        (
            {"container": None, "moves": [{"at_s": 5, "cgroup": "/x.scope"}, {"at_s": 9, "cgroup": "/x.scope"}]},
            r"moves\.1: the process is already in cgroup /x\.scope at 9 s",
        ),
        # /proc/<pid>/cgroup paths are absolute, from the cgroup root.
        (
            {"moves": [{"at_s": 5, "cgroup": "system.slice/x.scope"}]},
            r"processes\.0\.moves\.0\.cgroup: 'system\.slice/x\.scope' must start with / \(a path from the cgroup root",
        ),
        ({"cgroup": "kubepods/x"}, r"processes\.0\.cgroup: 'kubepods/x' must start with /"),
        ({"moves": [{"at_s": 5, "container": "ns/c/main"}]}, r"processes\.0 \(pid 500\)\.moves\.0\.container: no con"),
    ],
)
def test_moves_that_cannot_happen_are_refused_with_where(process: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(_data(**process))


def test_a_reused_pid_is_refused_saying_the_simulator_cannot_reuse_one() -> None:
    """A person building a pid the kernel reused (for ``series_start``) is told the simulator cannot, and which
    process holds the pid already."""
    data = _data(end_s=20)
    data["processes"].append({"pid": 500, "comm": "worker", "start_s": 30, "cpu_cores": 0.5})
    message = (
        r"processes\.1 \(pid 500\): duplicate pid: processes\.0 has it; a scenario's pid is one process for "
        r"the whole run \(the simulator does not reuse pids\)"
    )
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(data)


def test_a_gpu_process_cannot_move() -> None:
    data = _data(gpu=0, moves=[{"at_s": 5}])
    data["gpus"] = [{"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700}]
    with pytest.raises(ScenarioError, match="only a CPU-only process moves"):
        parse_scenario(data)
