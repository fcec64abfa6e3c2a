"""procfs's container usage for a container none of whose processes a scan lists: found below the pod cgroups of
the containers it reads (one ``scandir`` a pod a scan, ``ContainerScans._unlisted``), its identity from its path,
and, where its cgroup was made since the last scan's look, said so (``ContainerCpuTime.made_after_s``): all of its
usage is since then (tests/e2e/test_cpu_unseen_faults.py bills it end to end)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.receivers.test_procfs import make_receiver, write_process
from tests.receivers.test_procfs_cgroupcpu import mount, usage
from tests.receivers.test_procfs_containercpu import ID_A, ID_B, POD, UID, A, B, advance, containers

ID_C, ID_D = "c" * 64, "d" * 64
C = f"{POD}/cri-containerd-{ID_C}.scope"


def test_a_container_below_a_listed_ones_pod_is_read_its_first_record_a_baseline_or_made_since(
    tmp_path: Path,
) -> None:
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "make", utime=100, cgroup=f"0::{A}\n")
    usage(cgroups, A, 1_000_000)
    usage(cgroups, B, 4_000_000)  # there at the pod's first look: its usage has a past, a baseline
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    first = containers(receiver)
    assert first is not None
    b = first[ID_B]
    assert (b.usage_s, b.pod_uid, b.container_runtime, b.made_after_s) == (4.0, UID, "containerd", None)
    assert b.since_s == b.time.monotonic_s
    advance(receiver)
    usage(cgroups, C, 2_000_000)  # made since that look: its 2 s are all since
    usage(cgroups, B, 5_000_000)
    second = containers(receiver)
    assert second is not None
    c = second[ID_C]
    assert (c.usage_s, c.pod_uid, c.made_after_s) == (2.0, UID, b.time.monotonic_s)
    assert c.since_s == c.time.monotonic_s
    assert (second[ID_B].usage_s, second[ID_B].since_s, second[ID_B].made_after_s) == (5.0, b.since_s, None)
    advance(receiver)
    usage(cgroups, C, 3_000_000)
    third = containers(receiver)
    assert third is not None
    assert (third[ID_C].usage_s, third[ID_C].since_s, third[ID_C].made_after_s) == (3.0, c.since_s, None)
    advance(receiver)
    for gone in (B, C):
        os.remove(cgroups / gone.lstrip("/") / "cpu.stat")
        os.rmdir(cgroups / gone.lstrip("/"))
    assert sorted(containers(receiver) or {}) == [ID_A]  # removed: no record, not 0


def test_what_is_not_a_pods_container_by_its_path_gets_no_record(tmp_path: Path) -> None:
    # Only a container's cgroup directly below its pod's (the kubelet's layouts) has its pod looked below, and only
    # a directory named as a container is one: a runtime's monitor (crio-conmon-<id>), a plain name, a container
    # nested one level further, another container beside a Docker one (no pod) give no record: no guess.
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    docker = f"/system.slice/docker-{ID_B}.scope"
    write_process(proc, 10, "make", utime=100, cgroup=f"0::{A}\n")
    write_process(proc, 11, "app", utime=100, cgroup=f"0::{docker}\n")
    for path in (A, docker, f"/system.slice/docker-{ID_D}.scope", f"{POD}/crio-conmon-{ID_C}.scope", f"{POD}/extra"):
        usage(cgroups, path, 1_000_000)
    usage(cgroups, f"{POD}/extra/cri-containerd-{ID_D}.scope", 1_000_000)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    assert sorted(containers(receiver) or {}) == [ID_A, ID_B]
    advance(receiver)
    assert sorted(containers(receiver) or {}) == [ID_A, ID_B]


def test_the_cgroupfs_drivers_layout_and_its_runtime_unknown(tmp_path: Path) -> None:
    pod = f"/kubepods/burstable/pod{UID}"
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "make", utime=100, cgroup=f"0::{pod}/{ID_A}\n")
    usage(cgroups, f"{pod}/{ID_A}", 1_000_000)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    looked_s = (containers(receiver) or {})[ID_A].time.monotonic_s
    advance(receiver)
    usage(cgroups, f"{pod}/{ID_C}", 500_000)
    found = containers(receiver)
    assert found is not None
    c = found[ID_C]
    assert (c.usage_s, c.pod_uid, c.container_runtime, c.made_after_s) == (0.5, UID, None, looked_s)


def test_no_pod_is_looked_below_where_no_processor_asks_for_container_usage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, cgroups = tmp_path / "proc", mount(tmp_path / "cgroup")
    write_process(proc, 10, "make", utime=100, cgroup=f"0::{A}\n")
    usage(cgroups, A, 1_000_000)
    usage(cgroups, B, 1_000_000)
    looked: list[str] = []
    real = os.scandir

    def counting(path: Any) -> Any:
        looked.append(os.fsdecode(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", counting)
    receiver = make_receiver(proc, cgroup_root=str(cgroups))
    receiver.asked(frozenset({"process_cpu_time"}))  # unseen: none
    for _ in range(3):
        containers(receiver)
        advance(receiver)
    assert not [p for p in looked if "kubepods" in p]
    receiver.asked(frozenset({"process_cpu_time", "container_cpu_time"}))
    found = containers(receiver)
    assert sorted(found or {}) == [ID_A, ID_B]
    assert [p for p in looked if "kubepods" in p] == [str(cgroups) + POD]  # one look, at the one pod
