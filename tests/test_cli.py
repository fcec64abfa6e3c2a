"""The wattpipe command: validate, print-config, components, probe, exit codes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from wattpipe.cli import main

ROOT = Path(__file__).resolve().parents[1]
BROKEN = sorted((ROOT / "tests" / "configs").glob("*.yaml"))
SHIPPED = sorted((ROOT / "configs").glob("*.yaml"))
H = "tests.helpers.components"


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def expected_messages(path: Path) -> list[str]:
    return [
        line.removeprefix("# expect: ").rstrip()
        for line in path.read_text().splitlines()
        if line.startswith("# expect: ")
    ]


@pytest.mark.parametrize("path", BROKEN, ids=[p.stem for p in BROKEN])
def test_each_broken_config_exits_2_with_its_message(path: Path) -> None:
    code, out, err = run_cli("validate", "-c", str(path))
    assert code == 2
    assert out == ""
    for message in expected_messages(path):
        assert f"error: {message}" in err, err


def test_broken_configs_each_declare_what_they_expect() -> None:
    assert len(BROKEN) >= 10
    assert all(expected_messages(p) for p in BROKEN)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_configs_validate(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "test-node")
    code, out, err = run_cli("validate", "-c", str(path))
    assert code == 0, err
    assert "valid:" in out


def test_missing_config_file_exits_2() -> None:
    code, _, err = run_cli("validate", "-c", "/nonexistent/wattpipe.yaml")
    assert code == 2
    assert "no such file" in err


GOOD = f"""
receivers:
  custom/gpu: {{class: "{H}:CountingGpu", watts: 150, uuid: "${{env:GPU_UUID:-GPU-abc}}"}}
exporters:
  console: {{format: json}}
service:
  node_name: n1
  pipelines:
    metrics: {{interval: 2s, receivers: [custom/gpu], exporters: [console]}}
"""


def test_print_config_shows_defaults_and_expanded_env(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(GOOD)
    code, out, _ = run_cli("print-config", "-c", str(cfg))
    assert code == 0
    eff = yaml.safe_load(out)
    assert eff["receivers"]["custom/gpu"] == {"class": f"{H}:CountingGpu", "watts": 150, "uuid": "GPU-abc"}
    assert eff["exporters"]["console"] == {"format": "json", "output": "stdout", "kinds": [], "width": 0}
    assert eff["service"]["pipelines"]["metrics"]["interval"] == "2s"
    assert eff["service"]["pipelines"]["metrics"]["processors"] == []


def test_components_lists_every_builtin_with_stability() -> None:
    code, out, _ = run_cli("components", "--json")
    assert code == 0
    listed = {(c["kind"], c["type"]): c for c in json.loads(out)}
    for key in [("exporter", "console"), ("processor", "filter"), ("processor", "attributes"), ("receiver", "custom")]:
        assert key in listed
        assert listed[key]["stability"] in {"development", "alpha", "beta", "stable"}
        assert listed[key]["description"]


def test_probe_runs_one_receiver_once_and_prints_json(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(GOOD)
    code, out, err = run_cli("probe", "custom/gpu", "-c", str(cfg))
    assert code == 0, err
    (record,) = json.loads(out)
    assert record["type"] == "DeviceSample"
    assert record["attributes"]["device_id"] == "GPU-abc"
    assert record["values"]["power_w"] == 150
    assert record["values"]["energy_mj"] == 0


def test_probe_names_the_receivers_when_the_id_is_wrong(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(GOOD)
    code, _, err = run_cli("probe", "nvml", "-c", str(cfg))
    assert code == 2
    assert "no receiver 'nvml' (receivers defined: custom/gpu)" in err


def test_probe_reports_a_failing_receiver_with_exit_1(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        GOOD.replace("CountingGpu", "Flaky").replace(
            ', watts: 150, uuid: "${env:GPU_UUID:-GPU-abc}"', ", good_polls: 0"
        )
    )
    code, _, err = run_cli("probe", "custom/gpu", "-c", str(cfg))
    assert code == 1
    assert "receiver custom/gpu failed: ConnectionError: device went away" in err


def test_simulate_runs_node_time_back_to_back_and_attributes_the_simulated_gpus(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATTPIPE_CONSOLE_FORMAT", "json")
    monkeypatch.setenv("WATTPIPE_INTERVAL", "10s")
    code = main(["simulate", "--duration", "2m", "--log-level", "warning"])
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    powers = [r for r in lines if r["type"] == "DevicePower" and r["attributes"]["device_type"] == "gpu"]
    assert len(powers) == 2 * 12  # two GPUs, ticks at 0, 10, …, 120 s; the first only sets the baseline
    cpu = [r for r in lines if r["type"] == "DevicePower" and r["attributes"]["device_type"] == "cpu"]
    assert len(cpu) == 12  # the demo node's one RAPL package zone, beside the GPUs (configs/demo.yaml)
    device_totals = [
        r
        for r in lines
        if r["type"] == "DeviceTotals"
        and r["attributes"]["device_index"] == "0"
        and r["attributes"]["device_type"] == "gpu"
    ]
    energies = [r["values"]["energy_mj"] for r in device_totals]
    assert energies == sorted(energies)
    assert energies[-1] > 0
    shares = [r for r in lines if r["type"] == "GpuShare"]
    assert {r["attributes"].get("pid") for r in shares} >= {"4242"}


def test_demo_with_a_missing_scenario_is_a_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--scenario", "/nonexistent/node.yaml", "--ticks", "1"])
    assert code == 2
    assert "scenario /nonexistent/node.yaml" in capsys.readouterr().err


def test_the_readme_example_pipeline_validates(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## A pipeline", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = tmp_path / "readme.yaml"
    cfg.write_text(block)
    code, out, err = run_cli("validate", "-c", str(cfg))
    assert code == 0, err
    assert "metrics (1 receivers, 5 processors, 1 exporters)" in out


@pytest.mark.parametrize("command", ["simulate", "demo"])
def test_a_zero_duration_is_refused_with_a_clear_message(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    # simulate --duration=0s once ended in a ZeroDivisionError traceback (the report divided by the window).
    with pytest.raises(SystemExit) as exited:
        main([command, "--duration=0s"])
    assert exited.value.code == 2
    assert "argument --duration: '0s' is not above 0" in capsys.readouterr().err


def test_simulate_shorter_than_one_interval_reports_without_a_traceback(tmp_path: Path) -> None:
    # One tick only: the saturation windows cover 0 s, whose truth is unknown (null), not a ZeroDivisionError.
    report = tmp_path / "r.json"
    err = io.StringIO()
    assert (
        main(["simulate", "--duration", "1s", "--report", str(report), "--log-level", "error"], io.StringIO(), err) == 0
    )
    rows = json.loads(report.read_text())["saturation"]
    assert all(r["true_value"] is None for r in rows if r["window_s"] == 0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "-c", "configs/default.yaml", "--ticks", "0"], "argument --ticks: '0' is not a whole number above 0"),
        (["demo", "--ticks", "-1"], "argument --ticks: '-1' is not a whole number above 0"),
        (["simulate", "--ticks", "2.5"], "argument --ticks: '2.5' is not a whole number above 0"),
        (["probe", "rapl", "--count", "0"], "argument --count: '0' is not a whole number above 0"),
        (["probe", "rapl", "--every", "-1"], "argument --every: '-1' is not a number of seconds of 0 or more"),
        (["probe", "rapl", "--timeout", "0"], "argument --timeout: '0' is not a number of seconds above 0"),
    ],
)
def test_counts_and_seconds_that_cannot_be_are_refused_naming_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `run --ticks 0` and `demo --ticks -1` once started, ran no tick and said "stopped cleanly"; `probe --timeout 0`
    # said the receiver "did not answer within 0s".
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_readmes_configs_paths_work_from_outside_a_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # README says `wattpipe run -c configs/default.yaml`; from an installed wheel, in any directory, that file
    # was "no such file" although the wheel ships it (wattpipe/configs/). Now the shipped copy is used, and named.
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("validate", "-c", "configs/default.yaml")
    assert code == 0, err
    shipped = ROOT / "configs" / "default.yaml"
    assert f"configs/default.yaml is not in {tmp_path}: using the one installed with wattpipe, {shipped}" in err
    assert out.startswith(f"{shipped}: valid")
    code, _, err = run_cli("demo", "--scenario", "configs/scenarios/nope.yaml", "--ticks", "1")
    assert code == 2  # not shipped either: the error names the path as given
    assert "scenario configs/scenarios/nope.yaml: cannot read it" in err


def test_a_bare_scenario_name_that_wattpipe_ships_is_named_in_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--scenario cpu-moves.yaml` (the name docs/accuracy.md gives) said only "cannot read it": the error now
    # names the shipped one's path, which works from any directory (above).
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("simulate", "--scenario", "cpu-moves.yaml", "--duration", "1m")
    assert code == 2
    assert err == (
        "error: scenario cpu-moves.yaml: cannot read it: No such file or directory; wattpipe ships one of that "
        "name: --scenario configs/scenarios/cpu-moves.yaml\n"
    )
    code, _, err = run_cli("simulate", "--scenario", "nope.yaml", "--duration", "1m")
    assert err == "error: scenario nope.yaml: cannot read it: No such file or directory\n"


def test_a_local_configs_file_wins_over_the_installed_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "default.yaml").write_text(GOOD)
    code, out, err = run_cli("validate", "-c", "configs/default.yaml")
    assert code == 0, err
    assert out.startswith("configs/default.yaml: valid: metrics (1 receivers, 0 processors, 1 exporters)")
    assert "installed" not in err


def test_the_help_says_top_shows_cpu_zones_and_what_components_json_does(capsys: pytest.CaptureFixture[str]) -> None:
    # `wattpipe --help` once said top shows "GPUs, pods, processes", on a node where it shows CPU zones too.
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "GPUs and CPU (RAPL) zones, pods, processes" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        main(["components", "--help"])
    assert "--json      the same as JSON" in capsys.readouterr().out


def test_a_file_that_is_no_configuration_is_one_line_that_does_not_echo_it() -> None:
    # `wattpipe validate -c /etc/shadow` printed every line of it ("shadow:1 root:…: unknown section"), hashes and all.
    code, out, err = run_cli("validate", "-c", str(ROOT / "tests" / "configs" / "not_a_config.yaml"))
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert "secret-ish" not in err
    assert "daemon" not in err


def test_a_config_whose_sections_are_all_misspelt_still_gets_its_suggestions(tmp_path: Path) -> None:
    cfg = tmp_path / "typos.yaml"
    cfg.write_text("recievers: {nvml: {}}\nexporter: {console: {}}\nservce: {}\n")
    code, _, err = run_cli("validate", "-c", str(cfg))
    assert code == 2
    assert "typos.yaml:1 recievers: unknown section; did you mean 'receivers'?" in err
    assert "not a wattpipe configuration" not in err


def test_a_bad_value_read_from_the_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    # WATTPIPE_INTERVAL=abc said "default.yaml:28 service.pipelines.metrics.interval: 'abc' is not a duration"
    # and nothing of where 'abc' came from: line 28 says ${env:WATTPIPE_INTERVAL:-5s}.
    monkeypatch.setenv("WATTPIPE_INTERVAL", "abc")
    monkeypatch.setenv("WATTPIPE_PROMETHEUS_LISTEN", "nonsense")
    code, _, err = run_cli("validate", "-c", str(ROOT / "configs" / "default.yaml"))
    assert code == 2
    assert (
        "service.pipelines.metrics.interval: 'abc' is not a duration; write it like 500ms, 5s, 2m or 1h "
        "(that line reads the environment variable WATTPIPE_INTERVAL)"
    ) in err
    assert "exporters.prometheus.listen: 'nonsense' is not host:port" in err
    assert "(that line reads the environment variable WATTPIPE_PROMETHEUS_LISTEN)" in err
