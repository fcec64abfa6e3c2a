"""Configuration: env expansion, durations, component IDs, and errors that say file:line key: what."""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wattpipe.pipeline.components import ComponentConfig, Factory, Registry
from wattpipe.pipeline.config import (
    ConfigError,
    format_duration,
    load_config,
    load_config_text,
    parse_component_id,
    parse_duration,
)
from wattpipe.pipeline.yamlsource import expand_env


class DcgmLikeConfig(ComponentConfig):
    endpoint: str = ""
    timeout: float = 2.0
    port: int = 9400


class PlainConfig(ComponentConfig):
    pass


def _factory(kind: str, type_name: str, model: type[ComponentConfig] = PlainConfig) -> Factory:
    return Factory(type=type_name, kind=kind, config_model=model, create=lambda ctx, cfg: object(), description="t")  # type: ignore[arg-type]


@pytest.fixture
def registry() -> Registry:
    return Registry(
        [
            _factory("receiver", "dcgm", DcgmLikeConfig),
            _factory("receiver", "nvml"),
            _factory("processor", "idle"),
            _factory("exporter", "console"),
        ]
    )


def load(text: str, registry: Registry, env: dict[str, str] | None = None) -> object:
    return load_config_text(textwrap.dedent(text), "demo.yaml", registry, env or {})


def errors_of(text: str, registry: Registry, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(text, registry, env)
    return info.value.messages


GOOD = """\
receivers:
  dcgm:
    endpoint: http://localhost:9400/metrics
  nvml:
processors:
  idle:
exporters:
  console:
service:
  pipelines:
    metrics:
      interval: 5s
      receivers: [nvml, dcgm]
      processors: [idle]
      exporters: [console]
"""


# --- durations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("5s", 5.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1m30s", 90.0),
        ("1.5s", 1.5),
        (3, 3.0),
        (0.25, 0.25),
    ],
)
def test_durations_parse_to_seconds(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5", "5 sec", "s", "", "5x", "-5s", "5s5", True])
def test_bad_durations_are_refused_with_an_example(text: object) -> None:
    with pytest.raises(ValueError, match=r"duration|negative"):
        parse_duration(text)


@given(st.integers(min_value=1, max_value=10**7))
def test_whole_millisecond_durations_print_back_to_the_same_value(ms: int) -> None:
    assert parse_duration(format_duration(ms / 1000)) == pytest.approx(ms / 1000)


def test_interval_in_config_accepts_duration_text(registry: Registry) -> None:
    config = load(GOOD.replace("interval: 5s", "interval: 500ms"), registry)
    assert config.service.pipelines["metrics"].interval == 0.5  # type: ignore[attr-defined]
    assert config.service.pipelines["metrics"].effective_receiver_timeout == 0.25  # type: ignore[attr-defined]


# --- env expansion -----------------------------------------------------------------------------


def test_env_variable_and_default_expand() -> None:
    env = {"HOST": "dcgm.local"}
    assert expand_env("http://${env:HOST}:${env:PORT:-9400}/metrics", env) == "http://dcgm.local:9400/metrics"


def test_double_dollar_is_a_literal_dollar() -> None:
    assert expand_env("price$$5 ${env:X:-a}", {}) == "price$5 a"


def test_missing_env_without_default_is_an_error_with_its_line(registry: Registry) -> None:
    text = GOOD.replace("http://localhost:9400/metrics", "${env:DCGM_URL}")
    (msg,) = errors_of(text, registry)
    assert msg.startswith("demo.yaml:3 receivers.dcgm.endpoint: environment variable DCGM_URL is not set")


def test_whole_value_reference_takes_the_type_of_its_text(registry: Registry) -> None:
    text = GOOD.replace("endpoint: http://localhost:9400/metrics", "port: ${env:PORT}")
    config = load(text, registry, {"PORT": "9500"})
    assert config.receivers["dcgm"].port == 9500  # type: ignore[attr-defined]


def test_quoted_reference_stays_a_string(registry: Registry) -> None:
    text = GOOD.replace("http://localhost:9400/metrics", '"${env:PORTS}"')
    config = load(text, registry, {"PORTS": "9400"})
    assert config.receivers["dcgm"].endpoint == "9400"  # type: ignore[attr-defined]


def test_unknown_reference_syntax_is_reported(registry: Registry) -> None:
    (msg,) = errors_of(GOOD.replace("http://localhost:9400/metrics", "${HOME}"), registry)
    assert "'${HOME}' is not a valid reference" in msg


# --- IDs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "type_", "name"), [("nvml", "nvml", ""), ("dcgm/local", "dcgm", "local"), ("a_1/x.y-z", "a_1", "x.y-z")]
)
def test_component_ids_split_into_type_and_name(text: str, type_: str, name: str) -> None:
    cid = parse_component_id(text)
    assert (cid.type, cid.name, str(cid)) == (type_, name, text)


@pytest.mark.parametrize("text", ["", "NVML", "nvml/", "/x", "nv ml", "1nvml", "dcgm/a/b"])
def test_malformed_component_ids_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a component ID"):
        parse_component_id(text)


def test_two_instances_of_one_type_by_name(registry: Registry) -> None:
    text = GOOD.replace("  nvml:\n", "  nvml:\n  dcgm/second:\n    endpoint: http://b\n").replace(
        "[nvml, dcgm]", "[nvml, dcgm, dcgm/second]"
    )
    config = load(text, registry)
    assert config.receivers["dcgm/second"].endpoint == "http://b"  # type: ignore[attr-defined]
    assert list(config.receivers) == ["dcgm", "nvml", "dcgm/second"]  # type: ignore[attr-defined]


def test_duplicate_component_id_is_an_error_not_a_silent_override(registry: Registry) -> None:
    text = GOOD.replace("  nvml:\n", "  nvml:\n  dcgm:\n    endpoint: other\n")
    (msg,) = errors_of(text, registry)
    assert msg == "demo.yaml:5 receivers.dcgm: duplicate key (first at line 2)"


# --- errors with file, line and key --------------------------------------------------------


def test_unknown_option_names_line_key_and_suggestion(registry: Registry) -> None:
    (msg,) = errors_of(GOOD.replace("    endpoint:", "    endpont:"), registry)
    assert msg == "demo.yaml:3 receivers.dcgm.endpont: unknown option; did you mean 'endpoint'?"


def test_wrong_type_names_the_value(registry: Registry) -> None:
    (msg,) = errors_of(GOOD.replace("    endpoint: http://localhost:9400/metrics", "    timeout: soon"), registry)
    assert msg.startswith("demo.yaml:3 receivers.dcgm.timeout: ")
    assert "'soon'" in msg


def test_unknown_type_suggests_the_close_one(registry: Registry) -> None:
    text = GOOD.replace("  nvml:\n", "  nvmll:\n").replace("[nvml, dcgm]", "[nvmll, dcgm]")
    (msg,) = errors_of(text, registry)
    assert msg.startswith("demo.yaml:4 receivers.nvmll: unknown receiver type 'nvmll'; did you mean 'nvml'?")


def test_undefined_reference_and_unused_component_are_both_reported(registry: Registry) -> None:
    text = GOOD.replace("[nvml, dcgm]", "[nvml, dcgmm]")
    msgs = errors_of(text, registry)
    assert msgs == [
        "demo.yaml:13 service.pipelines.metrics.receivers[1]: receiver 'dcgmm' is not defined under receivers:; did you mean 'dcgm'?",
        "demo.yaml:2 receivers.dcgm: defined but not used in any pipeline (add it to a pipeline's receivers or remove it)",
    ]


def test_bad_interval_and_unknown_pipeline_key(registry: Registry) -> None:
    text = GOOD.replace("interval: 5s", "interval: soon\n      exporter: [console]")
    msgs = errors_of(text, registry)
    assert any(m.startswith("demo.yaml:12 service.pipelines.metrics.interval: 'soon' is not a duration") for m in msgs)
    assert "demo.yaml:13 service.pipelines.metrics.exporter: unknown option; did you mean 'exporters'?" in msgs


def test_non_metrics_pipeline_is_refused(registry: Registry) -> None:
    msgs = errors_of(GOOD.replace("    metrics:\n", "    traces:\n"), registry)
    assert any("metrics pipelines only" in m for m in msgs)


def test_yaml_syntax_error_names_the_line(registry: Registry) -> None:
    (msg,) = errors_of(GOOD.replace("  nvml:\n", "  nvml: [\n"), registry)
    assert msg.startswith("demo.yaml:")
    assert "not valid YAML" in msg


def test_unknown_top_level_section_suggests(registry: Registry) -> None:
    msgs = errors_of(GOOD.replace("processors:\n  idle:", "procesors:\n  idle:"), registry)
    assert "demo.yaml:5 procesors: unknown section; did you mean 'processors'?" in msgs


def test_missing_file_is_a_config_error(tmp_path: object, registry: Registry) -> None:
    with pytest.raises(ConfigError, match="cannot read the configuration"):
        load_config(f"{tmp_path}/absent.yaml", registry)


def test_effective_config_has_defaults_and_durations_as_text(registry: Registry) -> None:
    config = load(GOOD, registry, {})
    eff = config.effective()  # type: ignore[attr-defined]
    assert eff["receivers"]["dcgm"] == {"endpoint": "http://localhost:9400/metrics", "timeout": 2.0, "port": 9400}
    assert eff["service"]["pipelines"]["metrics"]["interval"] == "5s"
    assert eff["service"]["telemetry"] == {"listen": "127.0.0.1:8888", "log_level": "info", "web_config_file": ""}
    assert eff["service"]["shutdown_timeout"] == "10s"


def test_node_name_defaults_to_env_node_name(registry: Registry) -> None:
    config = load(GOOD, registry, {"NODE_NAME": "gpu-node-7"})
    assert config.service.node_name == "gpu-node-7"  # type: ignore[attr-defined]


def test_empty_env_value_stays_an_empty_string_not_null(registry: Registry) -> None:
    config = load(GOOD.replace("http://localhost:9400/metrics", "${env:EMPTY}"), registry, {"EMPTY": ""})
    assert config.receivers["dcgm"].endpoint == ""  # type: ignore[attr-defined]
