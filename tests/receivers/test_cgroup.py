"""parse_cgroup: every /proc/<pid>/cgroup shape of INTERFACES.md §4, as literal files."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wattpipe.receivers.procfs import CgroupIdentity, Runtime, parse_cgroup, parse_cgroup_path
from wattpipe.simulator.fake_host import cgroup_text
from wattpipe.simulator.scenario import parse_scenario

ID = "3f2b9c0e6a1d4e5f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f"
OUTER = "0123456789abcdef" * 4  # a kind node: the Docker container the inner pod runs in
UID = "a1b2c3d4-e5f6-4789-abcd-ef0123456789"
UID_ = UID.replace("-", "_")  # the systemd driver's spelling

V1_CONTROLLERS = ("hugetlb", "memory", "cpu,cpuacct", "pids", "devices", "blkio", "cpuset", "freezer", "name=systemd")


def v1(path: str, unified: str = "/") -> str:
    """A cgroup v1 (hybrid) file: one line per hierarchy, then the unified ``0::`` line."""
    lines = [f"{len(V1_CONTROLLERS) - i}:{c}:{path}" for i, c in enumerate(V1_CONTROLLERS)]
    return "\n".join([*lines, f"0::{unified}"]) + "\n"


SHAPES: list[tuple[str, str, str | None, str | None, Runtime | None]] = [
    # (name, path, container id, pod uid, runtime)
    (
        "containerd systemd burstable",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope",
        ID, UID, "containerd",
    ),
    (
        "containerd systemd besteffort",
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope",
        ID, UID, "containerd",
    ),
    ("containerd cgroupfs burstable", f"/kubepods/burstable/pod{UID}/{ID}", ID, UID, None),
    ("cgroupfs guaranteed (no QoS level)", f"/kubepods/pod{UID}/{ID}", ID, UID, None),
    ("guaranteed cri-o systemd", f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-{ID}.scope", ID, UID, "cri-o"),
    (
        "cri-o systemd burstable",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{ID}.scope",
        ID, UID, "cri-o",
    ),
    ("cri-o cgroupfs", f"/kubepods/besteffort/pod{UID}/crio-{ID}", ID, UID, "cri-o"),
    (
        "containerd under containerd.service (v1)",
        f"/system.slice/containerd.service/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{ID}",
        ID, UID, "containerd",
    ),
    (
        "nested kind: the deepest id",
        f"/system.slice/docker-{OUTER}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice"
        f"/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope",
        ID, UID, "containerd",
    ),
    (
        "nested kind, cgroupfs inside",
        f"/docker/{OUTER}/kubepods/besteffort/pod{UID}/{ID}",
        ID, UID, None,
    ),
    ("kind node's own kubelet", f"/system.slice/docker-{OUTER}.scope/system.slice/kubelet.service", OUTER, None, "docker"),
    ("docker systemd", f"/system.slice/docker-{ID}.scope", ID, None, "docker"),
    ("docker cgroupfs", f"/docker/{ID}", ID, None, "docker"),
    ("podman", f"/machine.slice/libpod-{ID}.scope", ID, None, "podman"),
    ("podman rootless", f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope", ID, None, "podman"),
    ("podman cgroupfs", f"/libpod_parent/libpod-{ID}", ID, None, "podman"),
    ("cgroup namespace", f"/../../pod{UID}/{ID}", ID, UID, None),
    (
        "cgroup namespace, systemd driver",
        f"/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope",
        ID, UID, "containerd",
    ),
    ("crun's inner container cgroup", f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-{ID}.scope/container", ID, UID, "cri-o"),
    (
        "static pod (32-hex uid)",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{'9f' * 16}.slice/cri-containerd-{ID}.scope",
        ID, "9f" * 16, "containerd",
    ),
    ("removed cgroup", f"/kubepods/burstable/pod{UID}/{ID} (deleted)", ID, UID, None),
    # Not containers: the runtime monitor, a mount unit named after the container, a pod-level cgroup.
    ("crio-conmon is not a container", f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{ID}.scope", None, UID, None),
    ("podman conmon", f"/machine.slice/libpod-conmon-{ID}.scope", None, None, None),
    (
        "rootfs mount unit",
        f"/system.slice/run-containerd-io.containerd.runtime.v2.task-k8s.io-{ID}-rootfs.mount",
        None, None, None,
    ),
    ("a short id is not an id", f"/docker/{ID[:12]}", None, None, None),
    ("uppercase hex is not an id", f"/docker/{ID.upper()}", None, None, None),
    # Host processes.
    ("sshd", "/system.slice/sshd.service", None, None, None),
    ("login session", "/user.slice/user-1000.slice/session-3.scope", None, None, None),
    ("user manager", "/user.slice/user-1000.slice/user@1000.service/init.scope", None, None, None),
    ("init", "/init.scope", None, None, None),
    ("root (kernel threads)", "/", None, None, None),
    ("kubepods slice itself", "/kubepods.slice/kubepods-burstable.slice", None, None, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "container_id", "pod_uid", "runtime"), [s[1:] for s in SHAPES], ids=[s[0] for s in SHAPES]
)
def test_every_shape_under_cgroup_v2(
    path: str, container_id: str | None, pod_uid: str | None, runtime: Runtime | None
) -> None:
    assert parse_cgroup(f"0::{path}\n") == CgroupIdentity(container_id, pod_uid, runtime)
    assert parse_cgroup_path(path) == CgroupIdentity(container_id, pod_uid, runtime)


@pytest.mark.parametrize(
    ("path", "container_id", "pod_uid", "runtime"), [s[1:] for s in SHAPES], ids=[s[0] for s in SHAPES]
)
def test_every_shape_under_cgroup_v1(
    path: str, container_id: str | None, pod_uid: str | None, runtime: Runtime | None
) -> None:
    assert parse_cgroup(v1(path)) == CgroupIdentity(container_id, pod_uid, runtime)


def test_v1_prefers_the_systemd_hierarchy_over_a_disagreeing_controller() -> None:
    other = "f" * 64
    text = (
        f"5:cpuset:/docker/{other}\n"
        f"4:memory:/kubepods/burstable/pod{UID}/{ID}\n"
        f"1:name=systemd:/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope\n"
        "0::/\n"
    )
    assert parse_cgroup(text) == CgroupIdentity(ID, UID, "containerd")


def test_v1_uses_the_line_that_names_a_container_when_systemd_does_not() -> None:
    # Older Docker on cgroup v1 left name=systemd at the session while the controllers moved.
    text = f"3:cpu,cpuacct:/docker/{ID}\n2:memory:/docker/{ID}\n1:name=systemd:/user.slice/session-1.scope\n"
    assert parse_cgroup(text) == CgroupIdentity(ID, None, "docker")


def test_v1_with_a_non_root_unified_line_agrees() -> None:
    path = f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{ID}.scope"
    assert parse_cgroup(v1(path, unified=path)) == CgroupIdentity(ID, UID, "cri-o")


def test_host_and_empty_files_name_nothing() -> None:
    assert parse_cgroup("") == CgroupIdentity()
    assert parse_cgroup("garbage without colons\n") == CgroupIdentity()
    assert parse_cgroup(v1("/system.slice/sshd.service")) == CgroupIdentity()


# --- round trips ------------------------------------------------------------------------------

hex64 = st.binary(min_size=32, max_size=32).map(bytes.hex)
uids = st.uuids().map(str)
qos = st.sampled_from(["burstable", "besteffort"])

Template = Callable[[str, str, str], str]  # (uid, id, qos) -> path
TEMPLATES: list[tuple[Template, Runtime | None]] = [
    (lambda u, i, q: f"/kubepods.slice/kubepods-{q}.slice/kubepods-{q}-pod{u.replace('-', '_')}.slice/cri-containerd-{i}.scope", "containerd"),
    (lambda u, i, q: f"/kubepods.slice/kubepods-pod{u.replace('-', '_')}.slice/crio-{i}.scope", "cri-o"),
    (lambda u, i, q: f"/kubepods.slice/kubepods-{q}.slice/kubepods-{q}-pod{u.replace('-', '_')}.slice/docker-{i}.scope", "docker"),
    (lambda u, i, q: f"/kubepods/{q}/pod{u}/{i}", None),
    (lambda u, i, q: f"/kubepods/pod{u}/{i}", None),
    (lambda u, i, q: f"/system.slice/containerd.service/kubepods-{q}-pod{u.replace('-', '_')}.slice:cri-containerd:{i}", "containerd"),
    (lambda u, i, q: f"/../../pod{u}/{i}", None),
]  # fmt: skip


@given(uid=uids, cid=hex64, q=qos, template=st.sampled_from(TEMPLATES), version=st.sampled_from([1, 2]))
def test_random_ids_round_trip_through_every_template(
    uid: str, cid: str, q: str, template: tuple[Template, Runtime | None], version: int
) -> None:
    make, runtime = template
    path = make(uid, cid, q)
    text = f"0::{path}\n" if version == 2 else v1(path)
    assert parse_cgroup(text) == CgroupIdentity(cid, uid, runtime)


@settings(max_examples=40, deadline=None)
@given(
    uid=uids,
    cid=hex64,
    q=st.sampled_from(["guaranteed", "burstable", "besteffort"]),
    runtime=st.sampled_from(["containerd", "cri-o", "docker"]),
    driver=st.sampled_from(["systemd", "cgroupfs"]),
    version=st.sampled_from([1, 2]),
)
def test_the_simulators_cgroup_files_round_trip(
    uid: str, cid: str, q: str, runtime: Runtime, driver: str, version: int
) -> None:
    scenario = parse_scenario(
        {
            "node": {"cgroup_driver": driver, "cgroup_version": version},
            "pods": [{"name": "p", "uid": uid, "qos": q, "containers": [{"name": "c", "id": cid, "runtime": runtime}]}],
            "processes": [{"pid": 100, "comm": "x", "container": "default/p/c"}, {"pid": 101, "comm": "sshd"}],
        }
    )
    expected_runtime = runtime if driver == "systemd" else None  # cgroupfs paths do not name the runtime
    assert parse_cgroup(cgroup_text(scenario, scenario.processes[0])) == CgroupIdentity(cid, uid, expected_runtime)
    assert parse_cgroup(cgroup_text(scenario, scenario.processes[1])) == CgroupIdentity()
