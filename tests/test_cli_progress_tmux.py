"""``wattpipe simulate`` as a person sees it in a terminal: a progress bar while it runs (node time done of
the total, ticks per second, time left), then only the summary. Run in tmux, the screen captured."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WATTPIPE = Path(sys.executable).parent / "wattpipe"

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


@pytest.fixture
def session() -> Iterator[str]:
    name = f"wattpipe-test-{uuid.uuid4().hex[:8]}"
    yield name
    # Its own tmux server (-L): other tmux users on the machine, or a test's server going away, cannot touch it.
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True, check=False)


def start(session: str, command: str, width: int = 120) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
    subprocess.run(
        [
            "tmux",
            "-L",
            session,
            "new-session",
            "-d",
            "-s",
            session,
            "-x",
            str(width),
            "-y",
            "40",
            f"cd {ROOT} && {command}; sleep 60",
        ],
        check=True,
        env=env,
    )


def screen(session: str) -> str:
    return subprocess.run(
        ["tmux", "-L", session, "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True
    ).stdout


def wait_for(session: str, pattern: str, timeout_s: float = 90.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = screen(session)
        if re.search(pattern, text):
            return text
        time.sleep(0.1)
    raise AssertionError(f"{pattern!r} not on the screen within {timeout_s}s:\n{screen(session)}")


def test_simulate_shows_a_progress_bar_then_only_the_summary(session: str) -> None:
    start(session, f"WATTPIPE_INTERVAL=10s {WATTPIPE} simulate --duration 1h --log-level info")

    running = wait_for(session, r"\d+:\d\d / 1:00:00 of node time · \d+ ticks/s")
    bar = next(line for line in running.splitlines() if "ticks/s" in line)
    match = re.search(r"simulating .+ (\d+):(\d\d) / 1:00:00 of node time · (\d+) ticks/s · (\S+) left", bar)
    assert match, bar
    assert 0 <= int(match.group(1)) * 60 + int(match.group(2)) <= 3600
    assert int(match.group(3)) >= 0
    assert re.fullmatch(r"-:--:--|\d+:\d\d:\d\d", match.group(4)), bar

    done = wait_for(session, r"attributed vs true energy after 3600 s")
    assert "ticks/s ·" not in done  # the bar is gone once the run ends
    assert re.search(r"simulated 1:00:00 of node time in 361 ticks, \d+\.\d s \(\d+ ticks/s\)", done)
    assert "── metrics" not in done  # no per-tick tables without --console
    assert "HTTP Request" not in done


def test_warning_level_shows_neither_bar_nor_log_lines(session: str) -> None:
    start(session, f"WATTPIPE_INTERVAL=10s {WATTPIPE} simulate --duration 10m --log-level warning; echo EXIT=$?")

    done = wait_for(session, r"EXIT=\d+")
    assert "EXIT=0" in done
    assert "ticks/s ·" not in done
    assert " INFO " not in done
    assert done.lstrip().startswith("simulated 10:00 of node time in 61 ticks")
