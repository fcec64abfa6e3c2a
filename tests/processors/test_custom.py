"""Type ``custom``: receivers, processors and exporters loaded by import path."""

from __future__ import annotations

import asyncio
import re
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.helpers.components import CountingGpu, EvenSplit, Recorder
from tests.helpers.context import make_context
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock, Timestamp
from wattpipe.pipeline.components import ComponentKind, CreateContext, Factory, Registry
from wattpipe.pipeline.config import ConfigError, load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.records import DevicePower, DeviceSample
from wattpipe.pipeline.runtime import PipelineRunner
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.processors.custom import CustomConfig, factory, load_class

H = "tests.helpers.components"


def custom_factory(kind: ComponentKind) -> Factory:
    (found,) = [f for f in factory if f.kind == kind]
    return found


def context(kind: ComponentKind, clock: SteppedClock | None = None) -> CreateContext:
    clock = clock or SteppedClock()
    return make_context("custom/x", kind, clock, node_name="node-a")


def create(kind: ComponentKind, options: dict[str, Any], ctx: CreateContext | None = None) -> object:
    f = custom_factory(kind)
    return f.create(ctx or context(kind), f.config_model.model_validate(options))


@pytest.fixture
def plugin_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A module ``fake_plugins`` with classes that misbehave in instructive ways."""
    module = types.ModuleType("fake_plugins")

    class BuggyInit:
        def __init__(self, *, size: int = 1) -> None:
            raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    class TakesContext:
        def __init__(self, *, context: CreateContext) -> None:
            self.context = context

    module.BuggyInit = BuggyInit  # type: ignore[attr-defined]
    module.TakesContext = TakesContext  # type: ignore[attr-defined]
    module.not_a_class = 42  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_plugins", module)
    return module


def test_every_kind_has_a_custom_factory_registered_by_entry_point() -> None:
    registry = Registry.from_entry_points()

    assert registry.load_errors == []
    for kind in ("receiver", "processor", "exporter"):
        found = registry.get(kind, "custom")
        assert found is not None, kind
        assert found.config_model is CustomConfig
    assert custom_factory("exporter").description.startswith("An exporter class")
    assert custom_factory("receiver").description.startswith("A receiver class")


def test_exporter_class_is_built_with_the_other_options_as_arguments(tmp_path: Path) -> None:
    exporter = create("exporter", {"class": f"{H}:Recorder", "path": str(tmp_path / "out.jsonl"), "slow_s": 0.25})

    assert isinstance(exporter, Recorder)
    assert exporter.path == tmp_path / "out.jsonl"
    assert exporter.slow_s == 0.25
    assert exporter.fail is False


def test_receiver_that_takes_context_gets_the_create_context() -> None:
    clock = SteppedClock(start_monotonic_s=500.0)
    ctx = context("receiver", clock)

    receiver = create("receiver", {"class": f"{H}:CountingGpu", "watts": 50, "uuid": "GPU-x"}, ctx)

    assert isinstance(receiver, CountingGpu)
    assert receiver.clock is clock
    assert receiver.watts == 50
    assert receiver.uuid == "GPU-x"
    asyncio.run(receiver.collect())  # the first poll sets the counter's origin
    clock.advance(2.0)
    (second,) = asyncio.run(receiver.collect())
    assert isinstance(second, DeviceSample)
    assert second.time.monotonic_s == 502.0
    assert second.energy_mj == pytest.approx(2.0 * 50 * 1000.0)


def test_context_is_injected_only_where_the_constructor_takes_it(plugin_module: types.ModuleType) -> None:
    ctx = context("processor")

    with_context = create("processor", {"class": "fake_plugins:TakesContext"}, ctx)
    without = create("processor", {"class": f"{H}:EvenSplit"}, ctx)

    assert with_context.context is ctx  # type: ignore[attr-defined]
    assert isinstance(without, EvenSplit)


def test_context_given_as_an_option_is_an_error(plugin_module: types.ModuleType) -> None:
    with pytest.raises(TypeError, match="'context' is given by wattpipe"):
        create("processor", {"class": "fake_plugins:TakesContext", "context": "mine"})


def test_unknown_module_is_an_import_error_naming_the_module() -> None:
    with pytest.raises(
        ImportError, match=r"class 'tests\.helpers\.nope:Recorder': cannot import module 'tests\.helpers\.nope'"
    ):
        create("exporter", {"class": "tests.helpers.nope:Recorder"})


def test_module_whose_own_code_fails_is_an_import_error_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_plugin_mod.py").write_text("raise RuntimeError('needs a GPU at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_plugin_mod", raising=False)

    with pytest.raises(ImportError, match="importing module 'broken_plugin_mod' failed: RuntimeError: needs a GPU"):
        load_class("broken_plugin_mod:Thing")


def test_missing_attribute_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match=r"module 'tests\.helpers\.components' has no 'Recordr'"):
        create("exporter", {"class": f"{H}:Recordr"})


def test_nested_attribute_path_is_followed() -> None:
    assert load_class("wattpipe.pipeline.batch:Batch") is Batch
    assert load_class("wattpipe.pipeline.clock:SteppedClock") is SteppedClock
    with pytest.raises(AttributeError, match=r"has no 'Batch\.Nope'"):
        load_class("wattpipe.pipeline.batch:Batch.Nope")


def test_not_a_class_is_a_type_error_saying_what_it_is(plugin_module: types.ModuleType) -> None:
    with pytest.raises(TypeError, match="class 'fake_plugins:not_a_class' is a int, not a class"):
        load_class("fake_plugins:not_a_class")
    with pytest.raises(TypeError, match="is a function, not a class"):
        load_class("json:dumps")


def test_wrong_option_is_a_type_error_naming_the_class() -> None:
    with pytest.raises(TypeError) as info:
        create("exporter", {"class": f"{H}:Recorder", "colour": "red"})

    text = str(info.value)
    assert f"class '{H}:Recorder' does not accept these options" in text
    assert "colour" in text


def test_type_error_inside_the_constructor_is_not_blamed_on_the_options(plugin_module: types.ModuleType) -> None:
    with pytest.raises(TypeError) as info:
        create("processor", {"class": "fake_plugins:BuggyInit", "size": 3})

    assert str(info.value) == "unsupported operand type(s) for +: 'int' and 'str'"


@pytest.mark.parametrize("path", ["tests.helpers.components", "tests/helpers:Recorder", ":Recorder", "mod:"])
def test_class_must_be_module_colon_name(path: str) -> None:
    with pytest.raises(ValidationError, match="class"):
        CustomConfig.model_validate({"class": path})


def test_options_are_everything_but_class() -> None:
    config = CustomConfig.model_validate({"class": f"{H}:CountingGpu", "watts": 50, "uuid": "GPU-1"})

    assert config.class_ == f"{H}:CountingGpu"
    assert config.options() == {"watts": 50, "uuid": "GPU-1"}


CONFIG = f"""
receivers:
  custom/x: {{class: "{H}:CountingGpu", watts: 50}}
  custom/procs: {{class: "{H}:ProcessLister", pids: [7, 8]}}
processors:
  custom/split: {{class: "{H}:EvenSplit"}}
exporters:
  custom/rec: {{class: "{H}:Recorder"}}
service:
  node_name: node-a
  pipelines:
    metrics:
      interval: 5s
      receivers: [custom/x, custom/procs]
      processors: [custom/split]
      exporters: [custom/rec]
"""


def test_custom_components_run_end_to_end_from_a_config() -> None:
    clock = SteppedClock()
    registry = Registry.from_entry_points()
    config = load_config_text(textwrap.dedent(CONFIG), "test.yaml", registry, {})
    graph = build(config, registry, clock, Telemetry(clock))
    runner = PipelineRunner(graph, graph.pipelines[0])

    async def three_ticks() -> None:
        for i in range(3):
            if i:
                clock.advance(5)
            await runner.tick()

    asyncio.run(three_ticks())

    recorder = graph.exporters["custom/rec"]
    assert isinstance(recorder, Recorder)
    assert len(recorder.batches) == 3
    energies_mj = [b.devices[0].energy_mj for b in recorder.batches]
    assert energies_mj == [0.0, 250_000.0, 500_000.0]  # 50 W × 5 s per tick
    assert [b.interval_s for b in recorder.batches] == [5.0, 5.0, 5.0]
    last = recorder.batches[-1]
    assert last.node == "node-a"
    assert last.time.monotonic_s == 1010.0
    (power,) = last.device_power
    assert isinstance(power, DevicePower)
    assert power.power_w == 50.0
    assert power.energy_j == 250.0
    assert [(share.pid, share.energy_j, share.power_w) for share in last.shares] == [(7, 125.0, 25.0), (8, 125.0, 25.0)]
    assert {"devices", "gpu_processes", "device_power", "shares"} <= last.present


def test_a_bad_class_in_a_config_fails_the_build_with_the_component_id() -> None:
    clock = SteppedClock()
    registry = Registry.from_entry_points()
    text = textwrap.dedent(CONFIG).replace(f'"{H}:Recorder"', f'"{H}:Recorder", colour: red')
    config = load_config_text(text, "test.yaml", registry, {})

    with pytest.raises(ConfigError) as info:
        build(config, registry, clock, Telemetry(clock))

    (message,) = info.value.messages
    assert re.match(r"test.yaml:\d+ exporters.custom/rec: cannot be built: class", message)
    assert "does not accept these options" in message


def test_timestamp_of_records_comes_from_the_injected_clock() -> None:
    clock = SteppedClock(start_wall_s=2_000_000_000.0, start_monotonic_s=10.0)
    receiver = create("receiver", {"class": f"{H}:CountingGpu"}, context("receiver", clock))
    assert isinstance(receiver, CountingGpu)

    (sample,) = asyncio.run(receiver.collect())

    assert sample.time == Timestamp(monotonic_s=10.0, wall_s=2_000_000_000.0)
