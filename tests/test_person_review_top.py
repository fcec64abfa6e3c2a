"""``wattpipe top`` on a node without GPUs, as a person runs it there (a review, used from the CLI).

Found by running ``wattpipe run -c configs/default.yaml`` on the development VM (no GPU, no RAPL) on the default
port and then ``wattpipe top``: top took the local wattpipe for "not a wattpipe" (its exposition names no GPU)
and started the simulated demo instead, showing a made-up GPU node as if it were this one. Read with
``--url``, the same exposition said "is this a wattpipe /metrics?" although top had just read its node name.
And ``top --demo --once`` on a CPU-only scenario waited its whole 60 s start budget: it waited for GPU power.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator

import pytest
from rich.console import Console

from tests.helpers.http_stub import serving
from tests.top.test_cpu import CPU_KEPLER
from wattpipe import top as top_module
from wattpipe._top_model import Snapshot, parse
from wattpipe._top_view import History, View, render

# What `wattpipe run -c configs/default.yaml` serves on a node with no GPU and no readable RAPL (scraped from
# the development VM, trimmed): the node's usage ratio, its CPUs and its processes' CPU time, no energy.
NO_ENERGY = """\
# HELP kepler_node_cpu_usage_ratio The node's CPU usage ratio over the last tick (0-1).
# TYPE kepler_node_cpu_usage_ratio gauge
kepler_node_cpu_usage_ratio{node_name="vm"} 0.30576441102654744
# HELP kepler_node_cpu_info A logical CPU as /proc/cpuinfo describes it (always 1).
# TYPE kepler_node_cpu_info gauge
kepler_node_cpu_info{core_id="0",model_name="AMD EPYC",node_name="vm",physical_id="0",processor="0",vendor_id="AuthenticAMD"} 1.0
# HELP kepler_process_cpu_seconds_total A process's user + system CPU time since it started.
# TYPE kepler_process_cpu_seconds_total counter
kepler_process_cpu_seconds_total{comm="process_api",node_name="vm",pid="1",type="regular"} 109.76
"""


def _serving(body: str) -> Iterator[str]:
    with serving(lambda path: (200, body.encode(), "text/plain; version=0.0.4")) as base:
        yield f"{base}/metrics"


@pytest.fixture
def cpu_only_wattpipe() -> Iterator[str]:
    """A wattpipe on a CPU-only node with RAPL: CPU zone and consumer series, not one GPU family."""
    yield from _serving(
        CPU_KEPLER.replace("kepler_node_cpu_usage_ratio 0.09", 'kepler_node_cpu_usage_ratio{node_name="n1"} 0.09')
    )


@pytest.fixture
def no_energy_wattpipe() -> Iterator[str]:
    yield from _serving(NO_ENERGY)


def test_a_cpu_only_wattpipe_on_the_default_port_is_read_not_replaced_by_the_demo(cpu_only_wattpipe: str) -> None:
    assert "gpu" not in CPU_KEPLER  # the premise: nothing in it names a GPU
    assert top_module._answers(cpu_only_wattpipe) is True


def test_a_wattpipe_with_no_energy_series_is_still_a_wattpipe(no_energy_wattpipe: str) -> None:
    # A node without GPU and RAPL (this VM): top must show *this* node and say why it has no rows.
    assert top_module._answers(no_energy_wattpipe) is True


def test_something_that_is_not_a_wattpipe_starts_the_demo_as_before() -> None:
    for body in ("up 1\n", "# HELP node_cpu_seconds_total x\n# TYPE node_cpu_seconds_total counter\n"):
        served = _serving(body)
        url = next(served)
        try:
            assert top_module._answers(url) is False
        finally:
            served.close()


def _screen(snapshot: Snapshot) -> str:
    out = io.StringIO()
    Console(file=out, width=170, color_system=None).print(render(snapshot, History(), View()))
    return out.getvalue()


def test_no_energy_series_says_so_and_does_not_doubt_the_source() -> None:
    shown = " ".join(_screen(parse(NO_ENERGY)).split())
    assert "node vm" in shown
    assert "is this a wattpipe" not in shown  # it is one: its node and naming scheme were just read
    assert "no GPU power and no RAPL zone series" in shown
    assert "wattpipe probe rapl" in shown  # where a person finds out why


def test_an_exposition_with_nothing_known_still_asks() -> None:
    assert "is this a wattpipe /metrics?" in _screen(parse("up 1\n"))


class _FakeDemo:
    returncode = None

    def poll(self) -> int | None:
        return None


class _CpuOnlyDemo:
    """A demo source whose node has CPUs and no GPU: every scrape has attributed CPU energy."""

    def __init__(self) -> None:
        self.demo = _FakeDemo()
        self.fetches = 0

    def fetch(self) -> Snapshot:
        self.fetches += 1
        return parse(CPU_KEPLER)


def test_once_with_a_cpu_only_demo_prints_as_soon_as_cpu_energy_is_attributed(monkeypatch: pytest.MonkeyPatch) -> None:
    source = _CpuOnlyDemo()
    out = io.StringIO()
    monkeypatch.setattr(top_module, "_ONCE_DEMO_SETTLE_S", 0.0)  # not what makes it wait (or not)
    started = time.monotonic()
    code = top_module._once(source, View(), Console(file=out, width=170, color_system=None), 8.0)  # type: ignore[arg-type]
    assert code == 0
    assert time.monotonic() - started < 5.0, "waited for GPU power on a node that has none"
    assert source.fetches == 1
    assert "CPU package intel-rapl:0 + intel-rapl:1" in out.getvalue()


def test_a_cpu_only_wattpipe_in_otel_names_is_recognised_too() -> None:
    from tests.top.test_cpu import CPU_OTEL
    from wattpipe._top_model import is_wattpipe

    assert is_wattpipe(CPU_OTEL)
    assert is_wattpipe("# HELP kepler_node_cpu_joules_total x\n# TYPE kepler_node_cpu_joules_total counter\n")
    assert not is_wattpipe("not an exposition {\n")


# A process that ended (its series kept, state="terminated", for the exporter's retention) and a new one the
# kernel gave its pid: two series, two processes. top keyed process rows by pid alone and merged them, mixing
# one's state and name with the other's watts and joules.
PID_REUSED = """\
kepler_process_cpu_watts{comm="oldjob",pid="900",state="terminated",type="regular",zone="package"} 0.0
kepler_process_cpu_joules_total{comm="oldjob",pid="900",state="terminated",type="regular",zone="package"} 55.0
"""


@pytest.mark.parametrize("text", [CPU_KEPLER + PID_REUSED, PID_REUSED + CPU_KEPLER], ids=["after", "before"])
def test_a_reused_pid_is_two_rows_not_one_mixed_row(text: str) -> None:
    snapshot = parse(text)
    (package,) = [cpu for cpu in snapshot.cpus if cpu.zone == "package"]
    rows = {(row.name, row.state): (row.watts, row.joules) for row in package.rows if row.kind == "process"}
    assert rows == {("900 sshd", "running"): (0.5, 1.3), ("900 oldjob", "terminated"): (0.0, 55.0)}


def test_a_reused_pid_with_the_same_name_is_told_apart_by_its_state() -> None:
    same = PID_REUSED.replace('comm="oldjob"', 'comm="sshd"')
    for text in (CPU_KEPLER + same, same + CPU_KEPLER):
        (package,) = [cpu for cpu in parse(text).cpus if cpu.zone == "package"]
        rows = {(row.name, row.state): (row.watts, row.joules) for row in package.rows if row.kind == "process"}
        assert rows == {("900 sshd", "running"): (0.5, 1.3), ("900 sshd", "terminated"): (0.0, 55.0)}
