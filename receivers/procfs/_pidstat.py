"""A process's ``/proc/<pid>/stat`` line: the fields this receiver uses, and the part that tells an exec."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ProcStat", "comm_of", "cpu_and_start", "exec_head", "parse_stat"]

PF_KTHREAD = 0x00200000  # field 9's flag for a kernel thread (include/linux/sched.h)


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` this receiver uses, in clock ticks (``SC_CLK_TCK``)."""

    comm: str
    utime_ticks: int
    stime_ticks: int
    start_time_ticks: int  # since boot: with the pid, what names one process across pid reuse


def parse_stat(text: str) -> ProcStat:
    """Parse one ``/proc/<pid>/stat`` line; raises ValueError when it is not one.

    Field 2 is ``(comm)``, and comm is whatever the process named itself: it may hold spaces and
    parentheses (``(a) (b)``), so the fields after it start after the *last* ``)``.
    """
    open_at = text.find("(")
    close_at = text.rfind(")")
    if open_at < 0 or close_at < open_at:
        raise ValueError("no '(comm)' field")
    rest = text[close_at + 1 :].split()  # rest[0] is field 3 (state), so field n is rest[n - 3]
    try:
        return ProcStat(
            comm=text[open_at + 1 : close_at],
            utime_ticks=int(rest[14 - 3]),
            stime_ticks=int(rest[15 - 3]),
            start_time_ticks=int(rest[22 - 3]),
        )
    except (IndexError, ValueError):
        raise ValueError(f"{len(rest) + 2} fields, or a non-number among utime/stime/starttime") from None


def cpu_and_start(line: bytes) -> tuple[int, int]:
    """utime + stime and the start time (clock ticks) of a stat line, as bytes: the per-tick read needs no
    more, and no decoding. Raises ValueError as :func:`parse_stat` does for a line that is not one."""
    close = line.rfind(b")")
    rest = line[close + 1 :].split(None, 20) if close >= 0 else []  # rest[0] is field 3, so field n is rest[n - 3]
    try:
        return int(rest[14 - 3]) + int(rest[15 - 3]), int(rest[22 - 3])
    except (IndexError, ValueError):
        parse_stat(line.decode("utf-8", errors="replace"))  # raises with the reason
        raise ValueError("not a stat line") from None


def comm_of(line: bytes) -> str:
    """The ``(comm)`` field of a stat line (from the first ``(`` to the last ``)``: comm may hold either)."""
    return line[line.find(b"(") + 1 : line.rfind(b")")].decode("utf-8", errors="replace")


def exec_head(line: bytes) -> bytes | None:
    """The stat line up to its comm's ``)``: where it differs in a later line with the same start time, the
    process exec'd (or renamed itself) since, and what it runs is to be read again. None for a kernel thread:
    it never execs, and a workqueue worker's comm names the work it does now (``kworker/1:2-events``)."""
    close = line.rfind(b")")
    try:
        flags = int(line[close + 1 :].split(None, 7)[9 - 3])
    except (IndexError, ValueError):
        flags = 0
    return None if flags & PF_KTHREAD else line[: close + 1]
