"""Review of procfs reading only the GPU processes (cpu_time off, after nvml): what an operator meets on a node
whose /proc is not what it should be."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.receivers.test_procfs import make_receiver, write_process
from tests.receivers.test_procfs_gpu_pids import after, listing


def test_a_root_with_no_process_directories_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # /host/proc configured, the volume not mounted: an empty directory in the image. Listing /proc said
    # "has no process directories: is it a /proc?"; reading only the GPU pids must not go silent.
    caplog.set_level(logging.WARNING)
    root = tmp_path / "proc"
    root.mkdir()
    receiver = make_receiver(root, cpu_time=False)
    assert after(receiver, listing(300)) == {}
    assert "has no process directories: is it a /proc?" in caplog.text


def test_gpu_pids_another_pid_namespace_lacks_are_left_out_silently(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # hostPID false: the container's own /proc, NVML's pids not in it (docs/kubernetes.md, degraded mode): no
    # record, no warning, every tick; host_processes present (observed: none of them), for the k8s processor.
    caplog.set_level(logging.WARNING)
    root = tmp_path / "proc"
    write_process(root, 1, "wattpipe")
    receiver = make_receiver(root, cpu_time=False)
    for _ in range(3):
        assert after(receiver, listing(4242, 5101)) == {}
        assert "host_processes" in receiver.provides
    assert caplog.text == ""


def test_a_missing_root_says_so_before_any_gpu_process(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Listing /proc said so at the first tick; reading only the GPU pids said nothing until a GPU process came
    # (a node whose jobs start later): node_cpu absent and no line naming why.
    caplog.set_level(logging.WARNING)
    receiver = make_receiver(tmp_path / "nowhere", cpu_time=False)
    assert after(receiver, listing()) == {}
    assert "is the host's /proc mounted there?" in caplog.text
