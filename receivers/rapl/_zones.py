"""Finding the RAPL zones of a powercap tree (``<root>/class/powercap``) and reading their files.

Linux names a package ``intel-rapl:N`` (its ``name`` file says ``package-N``) and its subzones
``intel-rapl:N:M`` (``core``, ``uncore``, ``dram``); a platform zone is a top-level ``intel-rapl:N`` named
``psys``. AMD Zen parts appear through the same ``intel-rapl`` control type. ``intel-rapl-mmio:N`` is a second
window on a package that the MSR zones already show (Intel client parts): it is dropped where a zone of the same
name exists under ``intel-rapl``, so no package is counted twice.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field

__all__ = ["Discovery", "Zone", "discover", "listing", "max_range", "read_int", "zone_kind"]

_ZONE_DIR = re.compile(r"^(?P<control>intel-rapl(?:-mmio)?):(?P<top>\d+)(?::(?P<sub>\d+))?$")
_PACKAGE = re.compile(r"^package-(?P<index>\d+)(?:-die-\d+)?$")  # multi-die parts: package-0-die-1


@dataclass(frozen=True, slots=True)
class Zone:
    """One zone directory: what it measures and where its counter is."""

    path: str  # the directory's name, e.g. intel-rapl:0:1
    directory: str  # the full path of that directory
    name: str  # the ``name`` file as written (package-0, core, dram, psys, ...)
    zone: str  # package | core | uncore | dram | psys (package-N -> package)
    socket: int | None  # the package index it belongs to; None for psys (or a subzone of no package)
    max_energy_range_uj: int | None  # where ``energy_uj`` wraps; None: not readable


@dataclass(slots=True)
class Discovery:
    """The zones found, the duplicates dropped, and why nothing was found (None when something was)."""

    zones: list[Zone] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # intel-rapl-mmio duplicates, by path
    problem: str | None = None
    # The zone directories it was made from (named ones; ``listing`` of the tree then): where the tree's listing
    # differs later (a package registered after the others, psys after the packages, a zone gone), read it again.
    seen: tuple[str, ...] = ()


def read_int(path: str) -> int:
    """An integer file of the powercap tree; raises OSError (PermissionError for a root-only file) or
    ValueError (not an integer)."""
    with open(path, encoding="ascii", errors="replace") as fh:
        text = fh.read().strip()
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{path} holds {text[:40]!r}, not an integer") from None


def zone_kind(name: str) -> tuple[str, int | None]:
    """A zone's ``name`` file → (zone, package index): ``package-1`` → (``package``, 1); ``package-0-die-1``
    (one die of a multi-die package, its own zone) → (``package``, 0); ``dram`` → (``dram``, None)."""
    match = _PACKAGE.match(name)
    if match:
        return "package", int(match["index"])
    return name.lower(), None


def _read_name(directory: str) -> str | None:
    try:
        with open(os.path.join(directory, "name"), encoding="utf-8", errors="replace") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def max_range(directory: str) -> int | None:
    """A zone directory's ``max_energy_range_uj``; None where it cannot be read or is not above 0."""
    try:
        value = read_int(os.path.join(directory, "max_energy_range_uj"))
    except (OSError, ValueError):
        return None
    return value if value > 0 else None


def _listing(powercap: str) -> tuple[list[str], str | None]:
    try:
        return sorted(os.listdir(powercap)), None
    except FileNotFoundError:
        return [], (
            f"no RAPL: {powercap} does not exist (a virtual machine, or a container without the host's /sys: "
            "mount it and set the receiver's root, e.g. /host/sys); no CPU energy"
        )
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            return [], f"no RAPL: {powercap} is not a directory; no CPU energy"
        return [], f"no RAPL: cannot list {powercap} ({exc.strerror or type(exc).__name__}); no CPU energy"


def listing(powercap: str) -> tuple[str, ...]:
    """The zone directories under ``powercap`` now, sorted (empty when it cannot be listed)."""
    names, _ = _listing(powercap)
    return tuple(n for n in names if _ZONE_DIR.match(n))


def discover(powercap: str) -> Discovery:
    """The RAPL zones under ``powercap`` (a ``class/powercap`` directory), packages before their subzones."""
    out = Discovery()
    names, problem = _listing(powercap)
    if problem is not None:
        out.problem = problem
        return out
    found: list[tuple[str, str, str, str]] = []  # (control, top, path, name)
    for entry in names:
        match = _ZONE_DIR.match(entry)
        if match is None:
            continue
        name = _read_name(os.path.join(powercap, entry))
        if name is not None:  # (one without a name yet, half made, differs from the next listing: read again)
            found.append((match["control"], match["top"], entry, name))
    out.seen = tuple(path for _, _, path, _ in found)
    msr_names = {name for control, _, _, name in found if control == "intel-rapl"}
    top_name = {(control, top): name for control, top, path, name in found if path.count(":") == 1}
    for control, top, path, name in found:
        if control == "intel-rapl-mmio" and top_name.get((control, top)) in msr_names:
            out.dropped.append(path)
            continue
        zone, socket = zone_kind(name)
        if path.count(":") == 2:  # a subzone belongs to its top-level zone's package
            socket = zone_kind(top_name.get((control, top), ""))[1]
        directory = os.path.join(powercap, path)
        out.zones.append(Zone(path, directory, name, zone, socket, max_range(directory)))
    if not out.zones:
        out.problem = (
            f"no RAPL zones under {powercap} (no intel-rapl:N directories: the intel_rapl_msr driver is not "
            "loaded, or the CPU has none); no CPU energy"
        )
    return out
