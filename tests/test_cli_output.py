"""What a person sees in the terminal (issue 20): a quiet simulate with a summary, quiet libraries, a
reader that goes away, a busy port, and errors that say where and what."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from wattpipe.cli import main
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import ConfigError, load_config_text
from wattpipe.steps import setup_logging, with_port

ROOT = Path(__file__).resolve().parents[1]
WATTPIPE = str(Path(sys.executable).parent / "wattpipe")
DEFAULT = str(ROOT / "configs" / "default.yaml")


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another program listens on (on every interface)."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def real_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """configs/default.yaml on this machine: state in a temporary folder, telemetry off, /proc as it is."""
    monkeypatch.setenv("WATTPIPE_STATE", str(tmp_path / "state.json"))
    monkeypatch.setenv("WATTPIPE_TELEMETRY_LISTEN", "")
    monkeypatch.setenv("WATTPIPE_INTERVAL", "200ms")


# --- logging --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("level", "library_info"), [("info", False), ("warning", False), ("debug", True)])
def test_other_libraries_log_info_only_at_debug(
    level: str, library_info: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging(level)
    logging.getLogger("httpx").info("HTTP Request: GET http://dcgm/metrics")
    logging.getLogger("httpx").warning("a library's warning")
    logging.getLogger("wattpipe.receiver.dcgm").info("our own info")
    err = capsys.readouterr().err

    assert ("HTTP Request" in err) is library_info
    assert "a library's warning" in err
    assert ("our own info" in err) is (level != "warning")
    assert logging.getLogger("wattpipe").level == logging.NOTSET  # nothing left behind on a logger


# --- simulate -------------------------------------------------------------------------------------


def test_simulate_prints_no_tables_but_a_summary_with_containers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATTPIPE_INTERVAL", "10s")
    assert main(["simulate", "--duration", "1m"]) == 0

    captured = capsys.readouterr()
    assert captured.out == ""  # demo.yaml's console exporter writes tables: only with --console
    assert "simulated 1:00 of node time in 7 ticks" in captured.err
    for row in ("container ml/trainer-0/main", "container research/notebook-3/jupyter", "container ml/batch-7/job"):
        assert re.search(rf"  {re.escape(row)} +\d+\.\d +\d+\.\d +[+-]\d+\.\d\d%", captured.err), captured.err
    assert "HTTP Request" not in captured.err  # httpx's line for every dcgm scrape
    assert " INFO wattpipe" in captured.err


def test_simulate_with_console_prints_each_tick_and_warning_level_hides_the_log(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATTPIPE_INTERVAL", "10s")
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["simulate", "--duration", "30s", "--console", "--log-level", "warning"]) == 0

    captured = capsys.readouterr()
    assert captured.out.count("── metrics · node demo-node · 2026-01-01 00:00:") == 4
    assert "device_power" in captured.out
    assert "totals · pod" in captured.out
    assert max(len(line) for line in captured.out.splitlines()) <= 100
    assert " INFO " not in captured.err
    assert "attributed vs true energy after 30 s" in captured.err


def test_console_adds_tables_to_a_pipeline_that_has_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        "receivers: {nvml: {}}\nprocessors: {idle: {}, attribution: {}}\nexporters: {console/jq: {format: json}}\n"
        "service: {pipelines: {metrics: {interval: 10s, receivers: [nvml], processors: [idle, attribution], "
        "exporters: [console/jq]}}}\n"
    )
    assert main(["simulate", "-c", str(cfg), "--duration", "20s", "--log-level", "warning"]) == 0
    plain = capsys.readouterr().out
    assert main(["simulate", "-c", str(cfg), "--duration", "20s", "--log-level", "warning", "--console"]) == 0
    both = capsys.readouterr().out

    assert "──" not in plain  # the JSON lines are the pipeline's own: always written
    assert len([line for line in plain.splitlines() if line.startswith("{")]) > 0
    assert [line for line in both.splitlines() if line.startswith("{")] != []
    assert both.count("── metrics · node demo-node") == 3


def test_a_duration_that_is_not_one_is_said_without_the_function_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--duration", "5parsecs"])

    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --duration: '5parsecs' is not a duration; write it like 500ms, 5s, 2m or 1h" in err
    assert "parse_duration" not in err


# --- a reader that goes away ----------------------------------------------------------------------


def test_probe_into_a_closed_pipe_exits_quietly() -> None:
    """``wattpipe probe procfs | head -1``: the reader is gone before the JSON is written."""
    proc = subprocess.Popen(
        [WATTPIPE, "probe", "procfs", "-c", DEFAULT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err
    assert "BrokenPipeError" not in err


def test_every_command_stops_quietly_when_its_output_breaks() -> None:
    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    err = io.StringIO()
    assert main(["components"], Closed(), err) == 141
    assert err.getvalue() == ""


def test_simulate_console_into_head_keeps_running_and_prints_its_summary(tmp_path: Path) -> None:
    env = {**os.environ, "WATTPIPE_INTERVAL": "10s", "COLUMNS": "100"}
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f'{WATTPIPE} simulate --duration 3m --console | head -2; echo "wattpipe exit ${{PIPESTATUS[0]}}" >&2',
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
        check=False,
    )

    assert "wattpipe exit 0" in proc.stderr
    assert len(proc.stdout.splitlines()) == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("the stdout reader went away (broken pipe): no more console output") == 1
    assert "attributed vs true energy after 180 s" in proc.stderr


# --- ports ----------------------------------------------------------------------------------------


def line_of(variable: str) -> int:
    """The line of configs/default.yaml that reads ``variable`` (the error names it by file:line)."""
    lines = Path(DEFAULT).read_text(encoding="utf-8").splitlines()
    return next(number for number, text in enumerate(lines, 1) if variable in text)


def test_a_busy_exporter_port_names_the_flag_the_option_and_the_variable(
    held_port: int, real_node: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "-c", DEFAULT, "--port", str(held_port), "--ticks", "1"])

    assert code == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 0.0.0.0:{held_port}: Address already in use" in err
    assert (
        "that port is in use (another wattpipe?): choose another with --port, exporters.prometheus.listen in "
        f"default.yaml:{line_of('WATTPIPE_PROMETHEUS_LISTEN')} or the environment variable WATTPIPE_PROMETHEUS_LISTEN "
        "(which that line reads)"
    ) in err


def test_a_busy_telemetry_port_names_the_option_and_the_variable(
    held_port: int, real_node: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WATTPIPE_TELEMETRY_LISTEN", f"127.0.0.1:{held_port}")
    code = main(["run", "-c", DEFAULT, "--port", "0", "--ticks", "1"])

    assert code == 1
    err = capsys.readouterr().err
    assert (
        f"choose another with service.telemetry.listen in default.yaml:{line_of('WATTPIPE_TELEMETRY_LISTEN')} or "
        "the environment variable "
        "WATTPIPE_TELEMETRY_LISTEN (which that line reads)"
    ) in err
    assert "--port" not in err.split("that port is in use")[1]


def test_run_logs_the_address_it_really_listens_on(real_node: None, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["run", "-c", DEFAULT, "--port", str(port), "--ticks", "2"]) == 0

    err = capsys.readouterr().err
    assert f"listening on 0.0.0.0:{port}: Prometheus metrics at http://127.0.0.1:{port}/metrics" in err


def test_demo_takes_a_port(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("WATTPIPE_TELEMETRY_LISTEN", "")
    monkeypatch.setenv("WATTPIPE_CONSOLE_FORMAT", "json")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["demo", "--port", str(port), "--ticks", "1", "--log-level", "info"]) == 0

    err = capsys.readouterr().err
    assert f"curl http://127.0.0.1:{port}/metrics" in err
    assert f"listening on 127.0.0.1:{port}" in err


def test_port_needs_exactly_one_prometheus_exporter() -> None:
    text = """
receivers: {procfs: {}}
exporters:
  prometheus: {listen: "127.0.0.1:1"}
  prometheus/two: {listen: "127.0.0.1:2"}
service: {pipelines: {metrics: {receivers: [procfs], exporters: [prometheus, prometheus/two]}}}
"""
    config = load_config_text(text, "two.yaml", Registry.from_entry_points(), {"NODE_NAME": "n"})
    with pytest.raises(
        ConfigError, match=r"--port: two.yaml has 2 prometheus exporters \(prometheus, prometheus/two\)"
    ):
        with_port(config, 9999)
    single = text.replace('  prometheus/two: {listen: "127.0.0.1:2"}\n', "").replace(", prometheus/two]", "]")
    one = load_config_text(single, "one.yaml", Registry.from_entry_points(), {"NODE_NAME": "n"})
    assert with_port(one, 9999).exporters["prometheus"].model_dump()["listen"] == "127.0.0.1:9999"


# --- errors ---------------------------------------------------------------------------------------


def test_validate_reports_every_problem_when_service_is_missing(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("receivers:\n  nvml:\n    requird: true\nexporters:\n  consol:\n    format: table\n")
    code, out, err = run_cli("validate", "-c", str(cfg))

    assert code == 2
    assert out == ""
    assert err.splitlines() == [
        "error: c.yaml service: required section is missing (it lists the pipelines: service: {pipelines: "
        "{metrics: {receivers: [...], exporters: [...]}}})",
        "error: c.yaml:3 receivers.nvml.requird: unknown option; did you mean 'required'?",
        "error: c.yaml:5 exporters.consol: unknown exporter type 'consol'; did you mean 'console'? "
        "(`wattpipe components` lists them)",
    ]


def test_a_section_that_is_not_a_mapping_does_not_hide_the_others(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "receivers: [nvml]\nexporters:\n  consol:\nservice:\n  pipelines:\n"
        "    metrics: {receivers: [nvml], exporters: [consol], interval: 5 seconds}\n"
    )
    code, _, err = run_cli("validate", "-c", str(cfg))

    assert code == 2
    assert err.splitlines() == [
        "error: c.yaml:1 receivers: must be a mapping of component IDs to their options",
        "error: c.yaml:6 service.pipelines.metrics.interval: '5 seconds' is not a duration; write it like 500ms, "
        "5s, 2m or 1h",
        "error: c.yaml:3 exporters.consol: unknown exporter type 'consol'; did you mean 'console'? "
        "(`wattpipe components` lists them)",
    ]


def test_a_service_that_does_not_validate_does_not_hide_undefined_and_unused_components(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "receivers:\n  nvml:\n    requird: true\nprocessors:\n  idle: {}\nexporters:\n  console: {}\n"
        "service:\n  pipelines:\n    metrics:\n      receivers: [nvml, procfs]\n      processors: [attribution]\n"
        "      exporters: [console, prometheus]\n      interval: 5 sec\n"
    )
    code, _, err = run_cli("validate", "-c", str(cfg))

    assert code == 2
    assert sorted(err.splitlines()) == sorted(
        [
            "error: c.yaml:14 service.pipelines.metrics.interval: '5 sec' is not a duration; write it like 500ms, "
            "5s, 2m or 1h",
            "error: c.yaml:3 receivers.nvml.requird: unknown option; did you mean 'required'?",
            "error: c.yaml:11 service.pipelines.metrics.receivers[1]: receiver 'procfs' is not defined under receivers:",
            "error: c.yaml:12 service.pipelines.metrics.processors[0]: processor 'attribution' is not defined under "
            "processors:",
            "error: c.yaml:13 service.pipelines.metrics.exporters[1]: exporter 'prometheus' is not defined under "
            "exporters:",
            "error: c.yaml:5 processors.idle: defined but not used in any pipeline (add it to a pipeline's processors "
            "or remove it)",
        ]
    )


def test_a_pipeline_whose_lists_are_broken_leaves_the_references_unchecked(tmp_path: Path) -> None:
    """Which components a broken list meant is unknown: no 'defined but not used' guessed from it."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "receivers: {nvml: {}}\nexporters: {console: {}}\n"
        "service: {pipelines: {metrics: {receivers: nvml, exporters: [console], interval: 5 sec}}}\n"
    )
    code, _, err = run_cli("validate", "-c", str(cfg))

    assert code == 2
    assert "not used" not in err
    assert "'5 sec' is not a duration" in err
    assert "receivers: Input should be a valid list" in err


def test_scenario_errors_say_scenario_file_line_and_the_key_meant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (ROOT / "configs" / "scenarios" / "demo.yaml").read_text()
    text = text.replace("    idle_w: 55", "    idle_watts: 55").replace(
        "ml/batch-7/job, gpu: 1", "ml/batch-8/job, gpu: 1"
    )
    scenario = tmp_path / "node.yaml"
    scenario.write_text(text)
    lines = text.splitlines()
    idle_line = next(i for i, line in enumerate(lines, 1) if "idle_watts" in line)

    assert main(["simulate", "--scenario", str(scenario), "--ticks", "1"]) == 2

    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"error: scenario {scenario}:{idle_line - 1} gpus.1.idle_w: required key is missing",
        f"error: scenario {scenario}:{idle_line} gpus.1.idle_watts: unknown key; did you mean 'idle_w'?",
    ]
    scenario.write_text(text.replace("idle_watts", "idle_w"))
    assert main(["simulate", "--scenario", str(scenario), "--ticks", "1"]) == 2
    (message,) = capsys.readouterr().err.splitlines()
    line = next(i for i, text_line in enumerate(lines, 1) if "batch-8" in text_line)
    assert message == (
        f"error: scenario {scenario}:{line} processes.2 (pid 6001).container: no container 'ml/batch-8/job' "
        "(namespace/pod/name)"
    )
    assert message.count(str(scenario)) == 1


# --- top ------------------------------------------------------------------------------------------


def test_top_is_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["top", "--help"])

    assert info.value.code == 0
    assert "--url" in capsys.readouterr().out


def test_the_demo_pipeline_names_the_node_of_the_scenario_it_runs_on(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # configs/demo.yaml once said node_name: demo-node whatever --scenario gave: `wattpipe top --demo --scenario
    # configs/scenarios/cpu.yaml` titled the node cpu-node "demo-node", and every series carried that name.
    monkeypatch.setenv("WATTPIPE_INTERVAL", "10s")
    monkeypatch.setenv("COLUMNS", "100")
    scenario = str(ROOT / "configs" / "scenarios" / "cpu.yaml")
    assert main(["simulate", "--scenario", scenario, "--duration", "20s", "--console", "--log-level", "warning"]) == 0
    out = capsys.readouterr().out
    assert out.count("── metrics · node cpu-node · ") == 3
    assert "demo-node" not in out


def test_a_busy_telemetry_port_says_it_can_be_turned_off_and_is_not_the_exporters(
    held_port: int, real_node: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A second `wattpipe demo --port 29000` beside a first stopped on the first's telemetry port (8888): the advice
    # did not say that an empty listen turns that listener off, nor that it is not the exporter's port.
    monkeypatch.setenv("WATTPIPE_TELEMETRY_LISTEN", f"127.0.0.1:{held_port}")
    assert main(["run", "-c", DEFAULT, "--port", "0", "--ticks", "1"]) == 1
    err = capsys.readouterr().err
    assert (
        "(which that line reads); or set it empty for no telemetry listener (/healthz, /readyz and wattpipe's own "
        "/metrics; the energy series are the exporter's)"
    ) in err


def test_run_takes_duration_as_demo_does(real_node: None, capsys: pytest.CaptureFixture[str]) -> None:
    # `wattpipe run -c configs/default.yaml --duration 8s` was "wattpipe: error: unrecognized arguments" under the
    # top-level usage, though demo and simulate take --duration.
    assert main(["run", "-c", DEFAULT, "--port", "0", "--duration", "1s"]) == 0  # 200 ms ticks: it stops itself
    assert "stopped cleanly" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["simulate", "demo"])
def test_a_simulated_node_never_writes_the_configurations_state_file(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `wattpipe simulate -c configs/default.yaml` wrote the simulated node's totals into the real node's
    # /var/lib/wattpipe/state.json; the next `wattpipe run` there said "written by node demo-node, not vm; using
    # it" and restored 2 simulated GPUs' idle power and 3 simulated processes' energy.
    real_state = tmp_path / "real" / "state.json"
    real_state.parent.mkdir()
    real_state.write_text("what the real node measured\n")
    monkeypatch.setenv("WATTPIPE_STATE", str(real_state))
    monkeypatch.setenv("WATTPIPE_TELEMETRY_LISTEN", "")
    monkeypatch.setenv("WATTPIPE_INTERVAL", "1s")
    extra = ["--port", "0"] if command == "demo" else []
    err = io.StringIO()
    assert main([command, "-c", DEFAULT, "--ticks", "3", "--log-level", "warning", *extra], io.StringIO(), err) == 0
    assert real_state.read_text() == "what the real node measured\n"
    assert list(real_state.parent.iterdir()) == [real_state]  # no checkpoint beside it either


def test_the_demo_still_writes_a_new_state_file_and_goes_on_from_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state.json"
    monkeypatch.setenv("WATTPIPE_STATE", str(state))
    monkeypatch.setenv("WATTPIPE_TELEMETRY_LISTEN", "")
    monkeypatch.setenv("WATTPIPE_INTERVAL", "1s")
    argv = ["demo", "-c", DEFAULT, "--ticks", "3", "--port", "0", "--log-level", "info"]
    assert main(argv, io.StringIO(), io.StringIO()) == 0
    assert json.loads(state.read_text())["node"] == "demo-node"  # the simulated node's own file
    capsys.readouterr()
    assert main(argv, io.StringIO(), io.StringIO()) == 0
    err = capsys.readouterr().err
    assert f"state loaded from {state}" in err
    assert "not used" not in err


@pytest.mark.parametrize("argv", [["--duration", "-5s"], ["--duration=-5s"], ["--duration", "-0.5m"]])
def test_a_negative_duration_is_said_as_one(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    # `--duration -5s` said only "argument --duration: expected one argument" (argparse took -5s for an option),
    # and `--duration=-5s` that '-5s' "is not a duration".
    with pytest.raises(SystemExit) as info:
        main(["simulate", *argv])

    assert info.value.code == 2
    value = argv[-1].removeprefix("--duration=")
    assert f"argument --duration: '{value}' is not above 0 (e.g. 30s, 10m)" in capsys.readouterr().err
