"""``wattpipe top``'s reading of an exposition (Kepler and OpenTelemetry names) and its drawing of it."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from wattpipe._top_model import Snapshot, parse
from wattpipe._top_view import History, View, render, sparkline

UUID = "GPU-d45a74cd-629a-2859-337f-5ff4d997a9cb"
POD = "8c661932-05d9-a49e-5d32-bf8e5da53cdc"
CID = "33728cf3499450d265724167e70cff80974cd60edd9bf383d07a1f9ccd5342ba"

KEPLER = f"""\
kepler_node_gpu_watts{{gpu="0",gpu_name="NVIDIA H100 80GB HBM3",gpu_uuid="{UUID}",node_name="n1",vendor="nvidia"}} 172.0
kepler_node_gpu_idle_watts{{gpu="0",gpu_uuid="{UUID}",node_name="n1"}} 72.0
wattpipe_node_gpu_idle_source{{gpu="0",gpu_uuid="{UUID}",idle_source="quiet",node_name="n1"}} 1.0
kepler_node_gpu_active_watts{{gpu="0",gpu_uuid="{UUID}",node_name="n1"}} 100.0
kepler_node_gpu_joules_total{{gpu="0",gpu_uuid="{UUID}",node_name="n1"}} 5000.0
wattpipe_node_gpu_unattributed_watts{{gpu="0",gpu_uuid="{UUID}",node_name="n1"}} 5.0
wattpipe_device_up{{gpu="0",gpu_uuid="{UUID}",node_name="n1"}} 1.0
kepler_node_gpu_info{{compute_mode="default",gpu="0",gpu_uuid="{UUID}",mig_enabled="false",node_name="n1"}} 1.0
wattpipe_attribution_mode{{gpu="0",gpu_uuid="{UUID}",mode="time_slicing",model="learned",node_name="n1"}} 1.0
kepler_process_gpu_watts{{comm="python",container_id="{CID}",gpu_uuid="{UUID}",pid="4242",pod_id="{POD}",state="running"}} 70.0
kepler_process_gpu_joules_total{{comm="python",container_id="{CID}",gpu_uuid="{UUID}",pid="4242",pod_id="{POD}"}} 700.0
kepler_process_gpu_watts{{comm="sshd",gpu_uuid="{UUID}",pid="900",state="running"}} 25.0
kepler_container_gpu_watts{{container_id="{CID}",container_name="main",gpu_uuid="{UUID}",pod_id="{POD}"}} 70.0
kepler_pod_gpu_watts{{gpu_uuid="{UUID}",pod_id="{POD}",pod_name="trainer-0",pod_namespace="ml"}} 70.0
kepler_pod_gpu_joules_total{{gpu_uuid="{UUID}",pod_id="{POD}",pod_name="trainer-0",pod_namespace="ml"}} 700.0
"""

# The same readings as a wattpipe with `naming: otel` exposes them (names and labels as the exporter writes).
OTEL = f"""\
hw_power_watts{{hw_id="{UUID}",hw_name="NVIDIA H100 80GB HBM3",hw_vendor="nvidia",k8s_node_name="n1",wattpipe_gpu_index="0"}} 172.0
wattpipe_gpu_power_idle_watts{{hw_id="{UUID}",k8s_node_name="n1",wattpipe_gpu_index="0"}} 72.0
wattpipe_gpu_power_idle_source{{hw_id="{UUID}",wattpipe_gpu_idle_source="quiet",k8s_node_name="n1"}} 1.0
wattpipe_gpu_power_active_watts{{hw_id="{UUID}",k8s_node_name="n1"}} 100.0
hw_energy_joules_total{{hw_id="{UUID}",k8s_node_name="n1"}} 5000.0
wattpipe_gpu_power_unattributed_watts{{hw_id="{UUID}",k8s_node_name="n1"}} 5.0
wattpipe_device_up{{hw_id="{UUID}",k8s_node_name="n1"}} 1.0
wattpipe_gpu_info{{hw_id="{UUID}",wattpipe_gpu_compute_mode="default",wattpipe_gpu_mig_enabled="false"}} 1.0
wattpipe_gpu_attribution{{hw_id="{UUID}",wattpipe_attribution_mode="time_slicing",wattpipe_attribution_model="learned"}} 1.0
wattpipe_process_gpu_power_watts{{process_command="python",container_id="{CID}",hw_id="{UUID}",process_pid="4242",k8s_pod_uid="{POD}",wattpipe_state="running"}} 70.0
wattpipe_process_gpu_energy_joules_total{{process_command="python",container_id="{CID}",hw_id="{UUID}",process_pid="4242",k8s_pod_uid="{POD}"}} 700.0
wattpipe_process_gpu_power_watts{{process_command="sshd",hw_id="{UUID}",process_pid="900",wattpipe_state="running"}} 25.0
wattpipe_container_gpu_power_watts{{container_id="{CID}",k8s_container_name="main",hw_id="{UUID}",k8s_pod_uid="{POD}"}} 70.0
wattpipe_pod_gpu_power_watts{{hw_id="{UUID}",k8s_pod_uid="{POD}",k8s_pod_name="trainer-0",k8s_namespace_name="ml"}} 70.0
wattpipe_pod_gpu_energy_joules_total{{hw_id="{UUID}",k8s_pod_uid="{POD}",k8s_pod_name="trainer-0",k8s_namespace_name="ml"}} 700.0
"""


def screen(snapshot: Snapshot, view: View | None = None, history: History | None = None) -> str:
    out = io.StringIO()
    Console(file=out, width=170, color_system=None).print(render(snapshot, history or History(), view or View()))
    return out.getvalue()


def test_kepler_exposition_gives_gpu_values_and_the_pod_container_process_tree() -> None:
    snap = parse(KEPLER)
    assert (snap.scheme, snap.node) == ("kepler", "n1")
    (gpu,) = snap.gpus
    assert (gpu.index, gpu.name, gpu.watts, gpu.idle_w, gpu.idle_source) == (
        "0",
        "NVIDIA H100 80GB HBM3",
        172,
        72,
        "quiet",
    )
    assert (gpu.active_w, gpu.joules, gpu.unattributed_w, gpu.up) == (100, 5000, 5, True)
    assert (gpu.compute_mode, gpu.mig_enabled, gpu.mode, gpu.model) == ("default", False, "time_slicing", "learned")
    pod, orphan, rest = gpu.rows
    assert (pod.kind, pod.name, pod.watts, pod.joules) == ("pod", "ml/trainer-0", 70, 700)
    (container,) = pod.children
    assert (container.name, container.watts, container.joules) == ("main", 70, None)  # no joules series: absent
    (process,) = container.children
    assert (process.name, process.watts, process.joules, process.state) == ("4242 python", 70, 700, "running")
    assert (orphan.kind, orphan.name, orphan.watts) == ("process", "900 sshd", 25)  # no container: under the GPU
    assert (rest.kind, rest.watts, rest.joules) == ("unattributed", 5, None)


def test_otel_names_give_the_same_snapshot() -> None:
    kepler, otel = parse(KEPLER), parse(OTEL)
    assert otel.scheme == "otel"
    assert otel.gpus == kepler.gpus


def test_a_value_no_series_carries_stays_absent_and_shows_as_a_dash() -> None:
    text = "\n".join(line for line in KEPLER.splitlines() if "idle" not in line and "info" not in line) + "\n"
    (gpu,) = parse(text).gpus
    assert (gpu.idle_w, gpu.idle_source, gpu.compute_mode, gpu.mig_enabled) == (None, None, None, None)
    (line,) = [ln for ln in screen(parse(text)).splitlines() if ln.startswith("GPU 0")]
    assert "—" in line
    assert "quiet" not in line


def test_the_screen_shows_share_of_active_watts_mode_and_idle_source() -> None:
    text = screen(parse(KEPLER))
    lines = {ln.strip().split("  ")[0]: ln for ln in text.splitlines()}
    assert "70.0%" in lines["ml/trainer-0"]
    assert "70.0%" in lines["4242 python"]
    assert "25.0%" in lines["900 sshd"]
    assert "5.0%" in lines["unattributed"]
    gpu = next(ln for ln in text.splitlines() if ln.startswith("GPU 0"))
    assert "72.0 (quiet)" in gpu
    assert "time_slicing (learned)" in gpu
    assert "default" in gpu
    assert "names: kepler" in text
    assert "node n1" in text


def test_rows_sort_by_watts_by_name_and_reversed_with_unattributed_last() -> None:
    snap = parse(KEPLER)

    def order(view: View) -> list[str]:
        names = ("ml/trainer-0", "900 sshd", "unattributed")
        found = [ln.strip().split("  ")[0] for ln in screen(snap, view).splitlines()]
        return [n for n in found if n in names]

    assert order(View(sort="w")) == ["ml/trainer-0", "900 sshd", "unattributed"]
    assert order(View(sort="w", reverse=True)) == ["900 sshd", "ml/trainer-0", "unattributed"]
    assert order(View(sort="n")) == ["900 sshd", "ml/trainer-0", "unattributed"]


def test_mig_instances_are_rows_of_their_gpu() -> None:
    text = KEPLER + (
        f'wattpipe_gpu_instance_watts{{gpu_uuid="{UUID}",gpu_instance_id="1",profile="3g.40gb"}} 40.0\n'
        f'wattpipe_gpu_instance_joules_total{{gpu_uuid="{UUID}",gpu_instance_id="1",profile="3g.40gb"}} 400.0\n'
    )
    (gpu,) = parse(text).gpus
    shown = [ln.strip().split("  ")[0] for ln in screen(parse(text), View(sort="n")).splitlines()]
    rows = [n for n in shown if n in ("MIG 1 3g.40gb", "900 sshd", "ml/trainer-0", "unattributed")]
    assert rows == ["MIG 1 3g.40gb", "900 sshd", "ml/trainer-0", "unattributed"]  # instances first, as a group
    assert (gpu.rows[0].kind, gpu.rows[0].name, gpu.rows[0].watts, gpu.rows[0].joules) == (
        "instance",
        "MIG 1 3g.40gb",
        40,
        400,
    )


def test_text_that_is_not_an_exposition_is_an_error_and_an_empty_one_has_no_gpus() -> None:
    with pytest.raises(ValueError, match="could not convert"):
        parse("hello world\n")
    assert parse("").gpus == []
    assert "no GPU or CPU series" in screen(parse("up 1\n"))


def test_history_keeps_the_last_points_per_gpu_for_the_sparkline() -> None:
    history = History(points=3)
    for watts in (100, 200, 300, 400):
        history.add(parse(KEPLER.replace("} 172.0", f"}} {watts}.0")))
    assert list(history.watts[UUID]) == [200, 300, 400]
    assert sparkline([0, 50, 100]) == "▁▅█"
    assert sparkline([0, 0]) == "▁▁"


@given(st.lists(st.floats(min_value=0, max_value=2000, allow_nan=False), max_size=40))
def test_sparkline_has_one_bar_per_value_and_the_largest_is_full(values: list[float]) -> None:
    line = sparkline(values)
    assert len(line) == len(values)
    if values and max(values) > 0:
        assert line[values.index(max(values))] == "█"


def test_no_share_of_a_gpu_drawing_nothing_above_idle() -> None:
    text = KEPLER.replace("} 100.0\n", "} 0.001\n", 1)  # the active watts line
    (gpu,) = parse(text).gpus
    assert gpu.active_w == 0.001
    lines = {ln.strip().split("  ")[0]: ln for ln in screen(parse(text)).splitlines()}
    assert "%" not in lines["unattributed"]
    assert lines["unattributed"].rstrip().endswith("—")


def _at(width: int, text: str = KEPLER) -> list[str]:
    history = History()
    for watts in (100, 172, 300):
        history.add(parse(text.replace("} 172.0", f"}} {watts}.0")))
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(render(parse(text), history, View()))
    return out.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 100, 120])
def test_a_narrow_terminal_keeps_every_number_whole_and_names_the_columns_it_leaves_out(width: int) -> None:
    lines = _at(width)
    assert max(len(line) for line in lines) <= width
    header = next(line for line in lines if line.startswith("device / pod"))
    for title in ("W", "active W", "J", "share"):  # the numbers' headers, never cut
        assert f" {title} " in f" {header} " or header.rstrip().endswith(f" {title}")
    assert "…" not in header
    gpu = next(line for line in lines if line.startswith("GPU 0"))
    assert "172.0" in gpu.split()  # watts
    assert "100.0" in gpu.split()  # active watts
    assert "5,000" in gpu.split()  # joules
    rows = {line.strip().split("  ")[0]: line for line in lines}
    assert rows["ml/trainer-0"].split()[-3:] == ["70.0", "700", "70.0%"]
    assert rows["4242 python"].split()[-3:] == ["70.0", "700", "70.0%"]
    assert rows["900 sshd"].split()[-3:] == ["25.0", "—", "25.0%"]  # no joules series: absent
    shown = [title for title in ("idle W (source)", "sharing", "attribution", "recent W") if title in header]
    hidden = [title for title in ("idle W (source)", "sharing", "attribution", "recent W") if title not in shown]
    if hidden:
        assert f"not shown at {width} columns: {', '.join(hidden)} (widen the terminal)" in lines
    assert "72.0 (quiet)" in gpu
    assert "idle W (source)" in shown


def test_a_wide_terminal_shows_every_column() -> None:
    lines = _at(170)
    header = next(line for line in lines if line.startswith("device / pod"))
    for title in ("W", "active W", "J", "share", "idle W (source)", "sharing", "attribution", "recent W"):
        assert title in header
    assert not any(line.startswith("not shown at") for line in lines)
    gpu = next(line for line in lines if line.startswith("GPU 0"))
    assert "time_slicing (learned)" in gpu
    assert "▃▅█" in gpu


def test_sorting_by_name_orders_pids_as_numbers() -> None:
    from wattpipe._top_model import Row
    from wattpipe._top_view import _sorted

    rows = [Row("process", name) for name in ("1001 python", "95 sh", "900 sshd", "900 sshd-session")]
    assert [r.name for r in _sorted(rows, View(sort="n"))] == ["95 sh", "900 sshd", "900 sshd-session", "1001 python"]


def test_energy_held_while_idle_is_not_known_is_said_where_idle_is() -> None:
    # The demo's first minute: 312 W and 0 J, because attribution holds the energy until the GPU's idle is known
    # (processors/_idle_hold.py). The row says how much is held, where the idle would be, so 0 J is not a mystery.
    text = "\n".join(line for line in KEPLER.splitlines() if "idle" not in line) + "\n"
    text += f'wattpipe_node_gpu_held_joules{{gpu="0",gpu_uuid="{UUID}",node_name="n1"}} 1500.0\n'
    (gpu,) = parse(text).gpus
    assert (gpu.idle_w, gpu.held_j) == (None, 1500.0)
    (line,) = [ln for ln in screen(parse(text)).splitlines() if ln.startswith("GPU 0")]
    assert "— (1,500 J held)" in line
    held_none = text.replace("} 1500.0", "} 0.0")
    (line,) = [ln for ln in screen(parse(held_none)).splitlines() if ln.startswith("GPU 0")]
    assert "held" not in line


def test_a_joule_count_under_half_a_joule_is_not_shown_as_zero() -> None:
    # J is shown whole; a process that has used 0.3 J read "0", as if it had used none (a person's test). Under
    # half a joule it reads "<1"; nothing at all is still "0".
    text = KEPLER.replace(f'pid="4242",pod_id="{POD}"}} 700.0', f'pid="4242",pod_id="{POD}"}} 0.3')
    lines = {ln.strip().split("  ")[0]: ln for ln in screen(parse(text)).splitlines()}
    assert " <1 " in lines["4242 python"]
    zero = KEPLER.replace(f'pid="4242",pod_id="{POD}"}} 700.0', f'pid="4242",pod_id="{POD}"}} 0.0')
    lines = {ln.strip().split("  ")[0]: ln for ln in screen(parse(zero)).splitlines()}
    assert " 0 " in lines["4242 python"]
    assert "<1" not in lines["4242 python"]
