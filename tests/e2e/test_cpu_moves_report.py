"""CPU attribution on a /proc as rough as a kernel's, end to end: `wattpipe simulate --report` on
configs/scenarios/cpu-moves.yaml, whose processes' utime and stime are truncated to whole ticks apart
(``user_share``) and four of which move to another cgroup without an exec (``moves``), read by the real procfs
(with the simulated cgroup v2 tree) and rapl receivers; each container's and pod's attributed energy against the
simulator's truth, which bills each container for the time a process ran in it, with ``unseen: none`` (the
default) and ``containers``, in ``mode: idle`` with the node's true idle (what is left is what each can see).
The bounds are the errors measured (docs/accuracy.md, "CPU"), with room for a hundredth's drift."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cpu_report import ROOT, cpu_report, group_errors

SCENARIO = ROOT / "configs" / "scenarios" / "cpu-moves.yaml"


def report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unseen: str) -> dict[str, Any]:
    cpu = cpu_report(tmp_path, monkeypatch, SCENARIO, "idle", unseen)
    for zone in cpu["zones"]:
        assert zone["counter_j"] == pytest.approx(zone["true_counter_j"], abs=1e-3)
    return cpu


def errors(cpu: dict[str, Any]) -> dict[str, float]:
    """Each container's, pod's and process's error against its truth (%), by ``scope/name``."""
    return group_errors(cpu) | {
        f"pid/{p['pid']}": 100 * (p["attributed_j"] / p["true_j"] - 1) for p in cpu["processes"]
    }


def test_moved_processes_against_the_truth_with_and_without_container_usage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed, unseen = report(tmp_path, monkeypatch, "none"), report(tmp_path, monkeypatch, "containers")
    # The truth follows the moves: etl-2's worker holds the java executor from 32 s and the converter from 75 s.
    true_j = {c["name"]: c["true_j"] for c in seed["containers"]}
    w = 5.5  # J per CPU-second: w_per_core + dram_w_per_core
    assert true_j["worker"] == pytest.approx(w * (0.3 * 180 + 1.5 * (180 - 32) + 1.0 * (180 - 75)), rel=0.03)
    none, containers = errors(seed), errors(unseen)
    # none: a process is read in the cgroup of its first read until that cgroup idles. The converter's (nginx's,
    # three busy workers) never does: nginx is billed its 105 s after the move (+19 %); containerd's never does
    # either: the executor stays a host process. etl-2 keeps 14 % of its energy.
    assert none["container/nginx"] == pytest.approx(19.23, abs=0.05)
    assert none["container/worker"] == pytest.approx(-85.80, abs=0.05)
    assert none["pod/etl-2"] == none["container/worker"]
    # rsync's service idles once it has left: a full read (every 12th scan) finds it in the toolbox.
    assert none["container/toolbox"] == pytest.approx(-1.93, abs=0.05)
    for name in ("container/postgres", "container/log-shipper", "pod/db"):
        assert abs(none[name]) < 0.25, name
    # containers: each moved process is found the scan after its old cgroup fell behind it (or idled), and the
    # time between is its new container's unseen time: etl-2 and web within 0.5 %. What the others pay (−0.5 %) is
    # the scans that found them: the moved process weighed as its own where it was read, and as unseen time where it is.
    assert containers["container/worker"] == pytest.approx(-0.47, abs=0.05)
    assert containers["container/nginx"] == pytest.approx(0.31, abs=0.05)
    for name in ("container/postgres", "container/log-shipper", "pod/db"):
        assert containers[name] == pytest.approx(-0.5, abs=0.1), name
    # rsync's stat is not read while the cgroup it left idles, so its time is the toolbox's unseen time, and the full
    # read brings it whole as rsync's delta, in the toolbox: less the toolbox's unseen seconds billed since rsync's last
    # read (processors/_cpu_unseen.py), or billed twice (+5.13 % before, and −0.97 % for the others).
    assert containers["container/toolbox"] == pytest.approx(-0.34, abs=0.05)
    # Pods are their containers' sums (web: nginx and its quiet log shipper).
    assert (none["pod/web"], containers["pod/web"]) == pytest.approx((19.20, 0.31), abs=0.05)
    assert (none["pod/debug-1"], containers["pod/debug-1"]) == (
        none["container/toolbox"],
        containers["container/toolbox"],
    )
    assert containers["pod/etl-2"] == containers["container/worker"]
    # A 0.003-core exporter (0.54 CPU-seconds in 3 min): /proc's truncation is most of its error with none; with
    # containers its cgroup is read on while no process of it is listed (its usage grew with no delta shown), which
    # gives that back: +0.30 % (−2.49 % when a container was read only in scans that listed a process of it).
    assert none["container/exporter"] == pytest.approx(-2.22, abs=0.05)
    assert containers["container/exporter"] == pytest.approx(0.30, abs=0.05)
    # A process's own bill hardly depends on where it is: within 0.25 % (none) and 0.65 % (containers: the scans
    # that found a moved process come off everyone), but the quiet ones (sleep at 0.001 of a core: −6.5 % / −6.4 %,
    # its last read's truncation) and the two that left a cgroup that then idles, whose stat is read again only by a
    # full read: their seconds since the last one are not read by the end of the run; with containers, rsync's
    # seconds while unread are the toolbox's unseen time, not its own (−6.05 %).
    for pid in (800, 950, 3300, 3301, 4101, 4103, 4201):
        assert abs(none[f"pid/{pid}"]) < 0.25, pid
        assert abs(containers[f"pid/{pid}"]) < 0.65, pid
    assert (round(none["pid/5301"], 2), round(none["pid/960"], 2)) == pytest.approx((-1.44, -0.50), abs=0.02)
    assert containers["pid/5301"] == pytest.approx(-6.05, abs=0.05)
