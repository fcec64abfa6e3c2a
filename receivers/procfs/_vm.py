"""A virtual machine's identity from its qemu process's command line.

A qemu (or qemu-kvm) process *is* the VM on the host: libvirt and most tools start it with ``-uuid <uuid>``
(the VM's id) and ``-name <name>`` (libvirt writes ``-name guest=<name>,debug-threads=on``). Options may be
written with one dash or two; in an option's value ``,,`` is a literal comma.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["VmIdentity", "looks_like_qemu", "parse_qemu_cmdline"]


@dataclass(frozen=True, slots=True)
class VmIdentity:
    vm_id: str | None  # the -uuid
    vm_name: str | None
    hypervisor: str  # kvm where KVM acceleration is asked for (or the binary is qemu-kvm), else qemu (emulated)


def looks_like_qemu(comm: str, exe: str | None) -> bool:
    """Whether a process may be a VM, by its name (comm is cut at 15 characters: ``qemu-system-x86``)."""
    binary = os.path.basename(exe) if exe else ""
    return comm.startswith("qemu") or comm == "kvm" or binary.startswith("qemu") or binary == "kvm"


def _split_options(value: str) -> list[str]:
    """qemu's ``a=b,c=d`` with ``,,`` standing for a comma inside a value."""
    parts, current, i = [], [], 0
    while i < len(value):
        if value[i] == ",":
            if value[i + 1 : i + 2] == ",":
                current.append(",")
                i += 2
                continue
            parts.append("".join(current))
            current = []
        else:
            current.append(value[i])
        i += 1
    parts.append("".join(current))
    return parts


def _option(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args[:-1]):
        if arg in (f"-{name}", f"--{name}"):
            return args[i + 1]
    return None


def _name(value: str | None) -> str | None:
    if value is None:
        return None
    parts = _split_options(value)
    for part in parts:
        if part.startswith("guest="):
            return part[len("guest=") :] or None
    first = parts[0]
    return first if first and "=" not in first else None


def _accelerated(args: list[str], binary: str) -> bool:
    if binary in ("qemu-kvm", "kvm") or "-enable-kvm" in args or "--enable-kvm" in args:
        return True
    for name in ("accel", "machine", "M"):
        value = _option(args, name)
        if value is not None and any(p in ("kvm", "accel=kvm") for p in _split_options(value)):
            return True
    return False


def parse_qemu_cmdline(cmdline: str) -> VmIdentity | None:
    """``/proc/<pid>/cmdline`` (NUL-separated) of a qemu process → its VM, or None when it names none."""
    args = [a for a in cmdline.split("\0") if a]
    if not args:  # a kernel thread, or a process that cleared its arguments
        return None
    binary = os.path.basename(args[0])
    if not (binary.startswith("qemu") or binary == "kvm"):
        return None
    vm_id = _option(args, "uuid")
    vm_name = _name(_option(args, "name"))
    return VmIdentity(vm_id=vm_id or None, vm_name=vm_name, hypervisor="kvm" if _accelerated(args, binary) else "qemu")
