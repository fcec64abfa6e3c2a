"""``wattpipe top``'s CPU side: RAPL zone types as device rows beside the GPUs, with their consumer trees.

The exposition is a ``wattpipe demo`` scrape (its CPU families, trimmed to one pod and one bare process; the
node_name label dropped), with a second package zone and a DRAM zone added as a two-socket node exposes them.
"""

from __future__ import annotations

import io

from rich.console import Console

from wattpipe._top_model import parse
from wattpipe._top_view import History, View, render

from .test_model import KEPLER

POD = "8c661932-05d9-a49e-5d32-bf8e5da53cdc"
CID = "33728cf3499450d265724167e70cff80974cd60edd9bf383d07a1f9ccd5342ba"
K8S = f'pod_id="{POD}",pod_name="trainer-0",pod_namespace="ml"'

CPU_KEPLER = f"""\
kepler_node_cpu_watts{{path="intel-rapl:0",zone="package"}} 76.0
kepler_node_cpu_active_watts{{path="intel-rapl:0",zone="package"}} 7.0
kepler_node_cpu_idle_watts{{path="intel-rapl:0",zone="package"}} 69.0
kepler_node_cpu_joules_total{{path="intel-rapl:0",zone="package"}} 1671.0
wattpipe_node_cpu_unattributed_joules_total{{path="intel-rapl:0",zone="package"}} 0.5
kepler_node_cpu_watts{{path="intel-rapl:1",zone="package"}} 64.0
kepler_node_cpu_active_watts{{path="intel-rapl:1",zone="package"}} 3.0
kepler_node_cpu_idle_watts{{path="intel-rapl:1",zone="package"}} 61.0
kepler_node_cpu_joules_total{{path="intel-rapl:1",zone="package"}} 1329.0
wattpipe_node_cpu_unattributed_joules_total{{path="intel-rapl:1",zone="package"}} 0.5
kepler_node_cpu_watts{{path="intel-rapl:0:0",zone="dram"}} 12.0
kepler_node_cpu_joules_total{{path="intel-rapl:0:0",zone="dram"}} 240.0
kepler_node_cpu_usage_ratio 0.09
kepler_process_cpu_watts{{comm="sshd",pid="900",state="running",type="regular",zone="package"}} 0.5
kepler_process_cpu_joules_total{{comm="sshd",pid="900",state="running",type="regular",zone="package"}} 1.3
kepler_process_cpu_watts{{comm="python",container_id="{CID}",pid="4242",{K8S},state="running",type="container",zone="package"}} 8.0
kepler_process_cpu_joules_total{{comm="python",container_id="{CID}",pid="4242",{K8S},state="running",type="container",zone="package"}} 30.0
kepler_container_cpu_watts{{container_id="{CID}",container_name="main",{K8S},runtime="containerd",state="running",zone="package"}} 8.0
kepler_container_cpu_joules_total{{container_id="{CID}",container_name="main",{K8S},runtime="containerd",state="running",zone="package"}} 30.0
kepler_pod_cpu_watts{{{K8S},state="running",zone="package"}} 8.0
kepler_pod_cpu_joules_total{{{K8S},state="running",zone="package"}} 30.0
kepler_pod_cpu_watts{{{K8S},state="running",zone="dram"}} 1.5
"""

# The same readings with `naming: otel`, names and labels as the exporter writes them (from a demo scrape).
O_K8S = f'k8s_namespace_name="ml",k8s_pod_name="trainer-0",k8s_pod_uid="{POD}"'
CPU_OTEL = f"""\
wattpipe_cpu_power_watts{{wattpipe_cpu_zone="package",wattpipe_cpu_zone_path="intel-rapl:0"}} 76.0
wattpipe_cpu_power_active_watts{{wattpipe_cpu_zone="package",wattpipe_cpu_zone_path="intel-rapl:0"}} 7.0
wattpipe_cpu_power_idle_watts{{wattpipe_cpu_zone="package",wattpipe_cpu_zone_path="intel-rapl:0"}} 69.0
wattpipe_cpu_energy_joules_total{{wattpipe_cpu_zone="package",wattpipe_cpu_zone_path="intel-rapl:0"}} 1671.0
wattpipe_cpu_energy_unattributed_joules_total{{wattpipe_cpu_zone="package",wattpipe_cpu_zone_path="intel-rapl:0"}} 0.5
wattpipe_cpu_power_watts{{wattpipe_cpu_zone="package",wattpipe_cpu_zone_path="intel-rapl:1"}} 64.0
wattpipe_cpu_power_active_watts{{wattpipe_cpu_zone="package",wattpipe_cpu_zone_path="intel-rapl:1"}} 3.0
wattpipe_cpu_power_idle_watts{{wattpipe_cpu_zone="package",wattpipe_cpu_zone_path="intel-rapl:1"}} 61.0
wattpipe_cpu_energy_joules_total{{wattpipe_cpu_zone="package",wattpipe_cpu_zone_path="intel-rapl:1"}} 1329.0
wattpipe_cpu_energy_unattributed_joules_total{{wattpipe_cpu_zone="package",wattpipe_cpu_zone_path="intel-rapl:1"}} 0.5
wattpipe_cpu_power_watts{{wattpipe_cpu_zone="dram",wattpipe_cpu_zone_path="intel-rapl:0:0"}} 12.0
wattpipe_cpu_energy_joules_total{{wattpipe_cpu_zone="dram",wattpipe_cpu_zone_path="intel-rapl:0:0"}} 240.0
system_cpu_utilization 0.09
wattpipe_process_cpu_power_watts{{process_command="sshd",process_pid="900",wattpipe_cpu_zone="package",wattpipe_process_type="regular",wattpipe_state="running"}} 0.5
wattpipe_process_cpu_energy_joules_total{{process_command="sshd",process_pid="900",wattpipe_cpu_zone="package",wattpipe_process_type="regular",wattpipe_state="running"}} 1.3
wattpipe_process_cpu_power_watts{{container_id="{CID}",{O_K8S},process_command="python",process_pid="4242",wattpipe_cpu_zone="package",wattpipe_process_type="container",wattpipe_state="running"}} 8.0
wattpipe_process_cpu_energy_joules_total{{container_id="{CID}",{O_K8S},process_command="python",process_pid="4242",wattpipe_cpu_zone="package",wattpipe_process_type="container",wattpipe_state="running"}} 30.0
wattpipe_container_cpu_power_watts{{container_id="{CID}",container_runtime="containerd",k8s_container_name="main",{O_K8S},wattpipe_cpu_zone="package",wattpipe_state="running"}} 8.0
wattpipe_container_cpu_energy_joules_total{{container_id="{CID}",container_runtime="containerd",k8s_container_name="main",{O_K8S},wattpipe_cpu_zone="package",wattpipe_state="running"}} 30.0
wattpipe_pod_cpu_power_watts{{{O_K8S},wattpipe_cpu_zone="package",wattpipe_state="running"}} 8.0
wattpipe_pod_cpu_energy_joules_total{{{O_K8S},wattpipe_cpu_zone="package",wattpipe_state="running"}} 30.0
wattpipe_pod_cpu_power_watts{{{O_K8S},wattpipe_cpu_zone="dram",wattpipe_state="running"}} 1.5
"""


def lines(text: str, width: int = 170, view: View | None = None) -> list[str]:
    out = io.StringIO()
    snapshot = parse(text)
    history = History()
    history.add(snapshot)
    Console(file=out, width=width, color_system=None).print(render(snapshot, history, view or View()))
    return out.getvalue().splitlines()


def test_a_zone_type_is_one_row_its_zones_summed_only_where_every_zone_has_the_value() -> None:
    snap = parse(CPU_KEPLER)
    assert snap.gpus == []
    package, dram = sorted(snap.cpus, key=lambda c: c.zone, reverse=True)
    assert (package.zone, package.paths, package.key) == ("package", ["intel-rapl:0", "intel-rapl:1"], "cpu:package")
    assert (package.watts, package.active_w, package.idle_w, package.joules) == (140, 10, 130, 3000)
    assert package.unattributed_j == 1.0
    assert (dram.paths, dram.watts, dram.joules) == (["intel-rapl:0:0"], 12, 240)
    assert (dram.active_w, dram.idle_w, dram.unattributed_j) == (None, None, None)  # absent, not zero


def test_a_zone_types_consumers_are_its_pod_container_process_tree() -> None:
    package = next(c for c in parse(CPU_KEPLER).cpus if c.zone == "package")
    pod, sshd, rest = package.rows
    assert (pod.kind, pod.name, pod.watts, pod.joules, pod.state) == ("pod", "ml/trainer-0", 8, 30, "running")
    (container,) = pod.children
    assert (container.name, container.watts, container.joules) == ("main", 8, 30)
    (process,) = container.children
    assert (process.name, process.watts, process.joules) == ("4242 python", 8, 30)
    assert (sshd.kind, sshd.name, sshd.watts) == ("process", "900 sshd", 0.5)  # no container: under the zone
    assert (rest.kind, rest.watts, rest.joules) == ("unattributed", None, 1.0)  # only a joules series exists
    dram = next(c for c in parse(CPU_KEPLER).cpus if c.zone == "dram")
    assert [(r.name, r.watts) for r in dram.rows] == [("ml/trainer-0", 1.5)]


def test_otel_names_give_the_same_cpu_rows() -> None:
    kepler, otel = parse(CPU_KEPLER), parse(CPU_OTEL)
    assert otel.scheme == "otel"
    assert otel.cpus == kepler.cpus
    assert [c.zone for c in otel.cpus] == ["dram", "package"]


def test_a_node_without_rapl_has_no_cpu_rows_and_its_gpu_screen_is_unchanged() -> None:
    assert parse(KEPLER).cpus == []
    assert not any(line.startswith("CPU ") for line in lines(KEPLER))


def test_cpu_rows_follow_the_gpus_with_shares_of_the_zone_types_active_power() -> None:
    shown = lines(KEPLER + CPU_KEPLER)
    gpu = next(i for i, line in enumerate(shown) if line.startswith("GPU 0"))
    package = next(i for i, line in enumerate(shown) if line.startswith("CPU package intel-rapl:0 + intel-rapl:1"))
    dram = next(i for i, line in enumerate(shown) if line.startswith("CPU dram intel-rapl:0:0"))
    assert gpu < package < dram  # sorted by watts: the package (140 W) before the DRAM (12 W)
    row = shown[package]
    assert row.split()[5:9] == ["140.0", "10.0", "3,000", "130.0"]
    assert "by CPU time" in row
    assert "█" in row  # the sparkline, from the history
    pods = [line for line in shown[package:dram] if line.strip().startswith("ml/trainer-0")]
    assert pods[0].split()[-3:] == ["8.0", "30", "80.0%"]  # 8 W of the package's 10 W active
    sshd = next(line for line in shown[package:dram] if "900 sshd" in line)
    assert sshd.split()[-3:] == ["0.5", "1", "5.0%"]
    dram_pod = next(line for line in shown[dram:] if "ml/trainer-0" in line)
    assert dram_pod.split()[-3:] == ["1.5", "—", "—"]  # the DRAM's active power is absent: no share


def test_a_node_with_cpu_series_only_is_drawn_and_fits_80_columns() -> None:
    shown = lines(CPU_KEPLER, width=80, view=View(sort="n"))
    assert not any("no GPU or CPU series" in line for line in shown)
    assert max(len(line) for line in shown) <= 80
    names = [line.split()[1] for line in shown if line.startswith("CPU ")]
    assert names == ["dram", "package"]  # sorted by name (the long name shrunk with an ellipsis to fit)
    package = next(line for line in shown if line.startswith("CPU package"))
    assert package.split()[-5:] == ["140.0", "10.0", "3,000", "130.0", "—"]  # the numbers whole; sharing: none


def test_a_vms_qemu_process_is_named_with_its_vm() -> None:
    """A qemu process's series carry its ``vm_id``; the VM's own series its ``vm_name``: the process row says
    which VM it runs (no VM row of its own: a KubeVirt qemu sits in a pod, whose row already counts it)."""
    uuid = "6f1c2a4e-9b1d-4c1e-8a53-2b7f0d9e4c11"
    vm = (
        f'kepler_process_cpu_watts{{comm="qemu-system-x86",pid="7001",state="running",type="vm",vm_id="{uuid}",'
        'zone="package"} 40.0\n'
        f'kepler_vm_cpu_watts{{hypervisor="kvm",state="running",vm_id="{uuid}",vm_name="db-vm",zone="package"}} 40.0\n'
    )
    snapshot = parse(CPU_KEPLER + vm)
    (package,) = [c for c in snapshot.cpus if c.zone == "package"]
    names = [row.name for row in package.rows]
    assert "7001 VM db-vm (qemu-system-x86)" in names
    assert "900 sshd" in names  # not a VM's: as before


def test_at_80_columns_a_qemu_row_still_says_which_vm_it_runs() -> None:
    # "7001 qemu-system-x86 (VM db-vm)" was cut to "7001 qemu-system-x8…" in the 22-column name: the VM's name,
    # the point of the row, was what fell off. Now the VM comes before the command.
    uuid = "6f1c2a4e-9b1d-4c1e-8a53-2b7f0d9e4c11"
    vm = (
        f'kepler_process_cpu_watts{{comm="qemu-system-x86",pid="7001",state="running",type="vm",vm_id="{uuid}",'
        'zone="package"} 40.0\n'
        f'kepler_vm_cpu_watts{{hypervisor="kvm",state="running",vm_id="{uuid}",vm_name="db-vm",zone="package"}} 40.0\n'
    )
    shown = lines(CPU_KEPLER + vm, width=80)
    assert max(len(line) for line in shown) <= 80
    (qemu,) = [line for line in shown if line.lstrip().startswith("7001 ")]
    assert qemu.lstrip().startswith("7001 VM db-vm")
    assert "40.0" in qemu.split()  # its watts, whole
