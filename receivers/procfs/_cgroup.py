"""From the text of ``/proc/<pid>/cgroup`` to the container and pod a process runs in.

Pure string work, no I/O. The shapes (INTERFACES.md §4) differ by runtime, cgroup driver, cgroup
version and nesting, but every one names a container as a 64-hex id in one path component and a pod as
``pod<uid>`` in another. So a path is read component by component from the deepest up: the deepest
container id wins (a kind node is itself a Docker container: the pod's container is the inner one), and
the pod UID is the deepest one at or above that container.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["CgroupIdentity", "Runtime", "parse_cgroup", "parse_cgroup_path"]

Runtime = Literal["containerd", "cri-o", "docker", "podman"]

_HEX64 = r"[0-9a-f]{64}"
# The scope (or, under the cgroupfs driver, directory) prefix each runtime puts before a container id.
# ``crio-conmon-<id>`` and ``libpod-conmon-<id>`` are the runtime's monitor process, not the container:
# they never match, because the id must follow the prefix directly.
_RUNTIME_BY_PREFIX: dict[str, Runtime] = {
    "cri-containerd": "containerd",
    "crio": "cri-o",
    "docker": "docker",
    "libpod": "podman",
}
_PREFIXES = "|".join(re.escape(p) for p in _RUNTIME_BY_PREFIX)
# <prefix>-<id>.scope (systemd driver), <prefix>-<id> (CRI-O/podman under cgroupfs), or a bare <id>
# (containerd under cgroupfs, /docker/<id>, a cgroup-namespaced /../../pod<uid>/<id>).
_SCOPE = re.compile(rf"(?:(?P<prefix>{_PREFIXES})-)?(?P<id>{_HEX64})(?:\.scope)?")
# containerd with systemd cgroups under containerd.service (cgroup v1): <pod slice>:<prefix>:<id>.
_COLON = re.compile(rf"(?P<slice>[^:]*):(?P<prefix>{_PREFIXES}):(?P<id>{_HEX64})")
# A pod UID is a UUID (36 characters; the systemd driver writes its dashes as ``_``, since ``-`` separates
# slice levels) or, for a static pod, a 32-hex hash. ``pod<uid>`` is a directory under cgroupfs and the
# end of a slice name under systemd: kubepods-pod<uid>.slice, kubepods-burstable-pod<uid>.slice, and in
# kind kubelet-kubepods-besteffort-pod<uid>.slice.
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_POD = re.compile(rf"(?:.*-)?pod(?P<uid>{_UID})(?:\.slice)?")
# The kernel appends this to a cgroup that was removed while the process was still in it.
_DELETED = " (deleted)"


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """Who a process is by its cgroup: all ``None`` for a host process.

    ``runtime`` is ``None`` where the path does not say (the cgroupfs driver's bare ``<id>`` directory).
    ``pod_uid`` always has dashes, as the API server writes it.
    """

    container_id: str | None = None
    pod_uid: str | None = None
    runtime: Runtime | None = None


_HOST = CgroupIdentity()


def _container(component: str) -> tuple[str, Runtime | None, str | None] | None:
    """(container id, runtime, the rest of the component that may name the pod) or None."""
    m = _SCOPE.fullmatch(component)
    if m is not None:
        prefix = m.group("prefix")
        return m.group("id"), _RUNTIME_BY_PREFIX[prefix] if prefix else None, None
    m = _COLON.fullmatch(component)
    if m is not None:
        return m.group("id"), _RUNTIME_BY_PREFIX[m.group("prefix")], m.group("slice")
    return None


def _pod_uid(component: str) -> str | None:
    m = _POD.fullmatch(component)
    return m.group("uid").replace("_", "-") if m is not None else None


def parse_cgroup_path(path: str) -> CgroupIdentity:
    """The container and pod one cgroup path names (the part after ``N:controllers:``)."""
    path = path.strip().removesuffix(_DELETED)
    components = [c for c in path.split("/") if c]
    container_id: str | None = None
    runtime: Runtime | None = None
    top = len(components)  # the pod UID is looked for at or above the container
    for index in range(len(components) - 1, -1, -1):
        found = _container(components[index])
        if found is None:
            continue
        container_id, runtime, pod_part = found
        if runtime is None and index > 0 and components[index - 1] == "docker":
            runtime = "docker"  # Docker under the cgroupfs driver: /docker/<id>
        if pod_part is not None:
            # The :cri-containerd: form carries the pod slice in the same component.
            uid = _pod_uid(pod_part)
            if uid is not None:
                return CgroupIdentity(container_id, uid, runtime)
        top = index
        break
    for index in range(top - 1, -1, -1):
        uid = _pod_uid(components[index])
        if uid is not None:
            return CgroupIdentity(container_id, uid, runtime)
    if container_id is None:
        return _HOST
    return CgroupIdentity(container_id, None, runtime)


def _rank(controllers: str) -> int:
    """Which hierarchy to believe first: systemd's (the one container runtimes always place a process
    in), then the unified one, then any other; under cgroup v1 they normally all agree."""
    names = controllers.split(",")
    if "name=systemd" in names:
        return 0
    if controllers == "":
        return 1
    return 2


def parse_cgroup(text: str) -> CgroupIdentity:
    """The container and pod a ``/proc/<pid>/cgroup`` file names; all ``None`` for a host process.

    cgroup v2 has one ``0::/path`` line, v1 one ``N:controllers:/path`` line per hierarchy (hybrid
    systems add a ``0::`` line too, often just ``/``). The first line, in order of preference, that names
    a container wins; failing that, one that names only a pod.
    """
    lines: list[tuple[int, int, str]] = []
    for position, line in enumerate(text.splitlines()):
        parts = line.split(":", 2)  # the path itself may contain ':' (the :cri-containerd: form)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        lines.append((_rank(controllers), position, path))
    pod_only: CgroupIdentity | None = None
    for _, _, path in sorted(lines):
        identity = parse_cgroup_path(path)
        if identity.container_id is not None:
            return identity
        if identity.pod_uid is not None and pod_only is None:
            pod_only = identity
    return pod_only or _HOST
