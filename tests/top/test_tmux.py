"""``wattpipe top`` as a person uses it: started in a tmux pane, keys sent, the screen captured and read.

With ``--demo`` top starts ``wattpipe demo`` itself (1 s ticks here); the demo's processes start at 10, 20
and 30 s of node time, so the test waits for all three pods (and the CPU package row) before it presses
keys. Needs tmux (.ci/run installs it); outside CI a machine without it skips, saying why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_NUMBER = re.compile(r"-?[\d,]+\.\d+|—")


class Pane:
    """One tmux server (its own socket) with one 170×50 pane running ``command``."""

    def __init__(self, command: str) -> None:
        self.socket = f"wattpipe-top-{uuid.uuid4().hex[:8]}"
        self.tmux("new-session", "-d", "-s", "top", "-x", "170", "-y", "50", command)

    def tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top")

    def press(self, key: str) -> None:
        self.tmux("send-keys", "-t", "top", key)

    def wait(self, check: Callable[[str], bool], timeout_s: float, what: str) -> str:
        deadline = time.monotonic() + timeout_s
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if check(screen):
                return screen
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}; the screen:\n{screen}")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


def _tmux() -> None:
    if shutil.which("tmux"):
        return
    if os.environ.get("CI"):
        pytest.fail("tmux is missing: .ci/run must install the Debian package 'tmux'")
    pytest.skip("tmux is not installed here (apt-get install tmux)")


@pytest.fixture
def pane() -> Iterator[Pane]:
    _tmux()
    command = (
        # The pane's own size, not a COLUMNS the test runner's environment may carry (rich prefers it).
        f"unset COLUMNS LINES; cd {ROOT} && WATTPIPE_INTERVAL=1s {sys.executable} -m wattpipe.top --demo --every 1; "
        'echo "top exited $?"; sleep 120'
    )
    p = Pane(command)
    try:
        yield p
    finally:
        p.kill()


def row(screen: str, name: str) -> tuple[int, list[str]]:
    """The line number of the row whose first cell is ``name``, and the numbers on it (``—`` for absent)."""
    for i, line in enumerate(screen.splitlines()):
        if line.strip().startswith(name):
            return i, _NUMBER.findall(line[len(line) - len(line.lstrip()) + len(name) :])
    raise AssertionError(f"no row {name!r} on the screen:\n{screen}")


def watts(screen: str, name: str) -> float:
    return float(row(screen, name)[1][0].replace(",", ""))


def _table(screen: str) -> list[str]:
    """The table's lines, without the title line (which says PAUSED)."""
    return [line for line in screen.splitlines() if not line.startswith("wattpipe top")]


def _all_pods(screen: str) -> bool:
    pods = all(p in screen for p in ("ml/trainer-0", "research/notebook-3", "ml/batch-7"))
    return pods and "time_slicing" in screen and "CPU package intel-rapl:0" in screen


def test_top_in_tmux_shows_the_demo_tree_and_follows_the_keys(pane: Pane) -> None:
    screen = pane.wait(_all_pods, 120, "the demo's three pods, time-slicing on the H100 and the CPU package row")
    # The tree: GPU → pod → container → process, each level indented further.
    gpu0, _ = row(screen, "GPU 0 NVIDIA H100 80GB HBM3")
    pod, _ = row(screen, "ml/trainer-0")
    container, _ = row(screen, "main")
    process, _ = row(screen, "4242 python")
    assert gpu0 < pod < container < process
    lines = screen.splitlines()
    indents = [len(lines[i]) - len(lines[i].lstrip()) for i in (gpu0, pod, container, process)]
    assert indents == sorted(indents)
    assert len(set(indents)) == 4
    # Watts on the H100: above its idle (72 W), its idle learned from a free span, the mode time_slicing.
    assert watts(screen, "GPU 0 NVIDIA H100 80GB HBM3") > 72
    assert "(free)" in lines[gpu0]
    assert "time_slicing" in lines[gpu0]
    assert "default" in lines[gpu0]
    gpu1, _ = row(screen, "GPU 1 NVIDIA A100-SXM4-80GB")
    assert "exclusive_process" in lines[gpu1]
    assert re.search("[▁▂▃▄▅▆▇█]{2,}", lines[gpu0]), lines[gpu0]  # a sparkline with history
    share = re.search(r"(\d+\.\d)%", lines[pod])
    assert share
    assert 0 < float(share.group(1)) <= 100.0
    # The CPU side: the demo's RAPL package zone is a device row after the GPUs, with its own pod tree.
    cpu, numbers = row(screen, "CPU package intel-rapl:0")
    assert cpu > gpu1
    assert float(numbers[0].replace(",", "")) > 0, lines[cpu]  # its watts
    assert "by CPU time" in lines[cpu]
    assert any(line.strip().startswith("ml/trainer-0") for line in lines[cpu + 1 :])
    assert re.search(r"\d+\.\d%", "\n".join(lines[cpu + 1 :]))  # a share of the package's active power
    # Sorted by watts (the default): within the H100 the pod drawing more comes first.
    assert "sorted by watts" in screen
    trainer, notebook = row(screen, "ml/trainer-0"), row(screen, "research/notebook-3")
    if watts(screen, "ml/trainer-0") != watts(screen, "research/notebook-3"):
        first = trainer if watts(screen, "ml/trainer-0") > watts(screen, "research/notebook-3") else notebook
        assert first[0] == min(trainer[0], notebook[0])

    pane.press("n")
    screen = pane.wait(lambda s: "sorted by name" in s and "reversed" not in s, 15, "sorted by name")
    assert row(screen, "ml/trainer-0")[0] < row(screen, "research/notebook-3")[0]
    assert row(screen, "GPU 0 ")[0] < row(screen, "GPU 1 ")[0]
    pane.press("r")
    screen = pane.wait(lambda s: "sorted by name (reversed)" in s, 15, "reversed")
    assert row(screen, "research/notebook-3")[0] < row(screen, "ml/trainer-0")[0]
    assert row(screen, "GPU 1 ")[0] < row(screen, "GPU 0 ")[0]
    pane.press("j")
    pane.wait(lambda s: "sorted by joules (reversed)" in s, 15, "sorted by joules")
    # Narrowed to 80 columns: redrawn to fit, every number whole, the GPU details that do not fit named.
    pane.tmux("resize-window", "-t", "top", "-x", "80", "-y", "50")
    screen = pane.wait(lambda s: "not shown at 80 columns:" in s, 15, "the screen redrawn at 80 columns")
    assert max(len(line) for line in screen.splitlines()) <= 80
    header = next(line for line in screen.splitlines() if line.startswith("device / pod"))
    assert re.search(r" W +active W +J +share", header), header
    assert "…" not in header
    process_line = screen.splitlines()[row(screen, "4242 python")[0]]
    assert re.search(r"python +\d+\.\d +[\d,]+ +\d+\.\d%$", process_line.rstrip()), process_line
    assert watts(screen, "GPU 0 NVIDIA H100 80GB HBM3") > 72
    # p pauses: the screen keeps its numbers over several scrapes (1 s apart) until p again.
    pane.press("p")
    paused = pane.wait(lambda s: "PAUSED" in s, 15, "PAUSED in the title")
    time.sleep(3)
    assert _table(pane.screen()) == _table(paused)
    pane.press("p")
    resumed = pane.wait(lambda s: "PAUSED" not in s and _table(s) != _table(paused), 15, "the numbers moving again")
    assert "not shown at 80 columns:" in resumed
    pane.press("q")
    screen = pane.wait(lambda s: "top exited" in s, 20, "top to exit")
    assert "top exited 0" in screen


def test_top_in_tmux_on_the_cpu_node_at_80_columns_names_the_node_and_its_vm() -> None:
    """``top --demo --scenario configs/scenarios/cpu.yaml`` in an 80-column pane: the title names the scenario's
    node (it said demo-node), and the KVM guest's qemu row keeps the VM's name in the cut name column (it was
    ``7001 qemu-system-x8…``), under both RAPL zone types, with its watts."""
    _tmux()
    command = (
        f"unset COLUMNS LINES; cd {ROOT} && WATTPIPE_INTERVAL=1s {sys.executable} -m wattpipe.top --demo --every 1 "
        f"--scenario configs/scenarios/cpu.yaml; "
        'echo "top exited $?"; sleep 120'
    )
    pane = Pane(command)
    try:
        pane.tmux("resize-window", "-t", "top", "-x", "80", "-y", "50")
        screen = pane.wait(lambda s: s.count("7001 VM db-vm") == 2, 120, "the VM's row under package and dram")
        assert "node cpu-node" in screen
        assert "demo-node" not in screen
        assert max(len(line) for line in screen.splitlines()) <= 80
        vm_rows = [line for line in screen.splitlines() if line.strip().startswith("7001 VM db-vm")]
        assert all(float(_NUMBER.findall(line)[0]) > 0 for line in vm_rows), vm_rows  # its watts
        pane.press("q")
        assert "top exited 0" in pane.wait(lambda s: "top exited" in s, 20, "top to exit")
    finally:
        pane.kill()
