"""Processor ``attributes``: label edits that travel with the Batch and apply, in order, at render time."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
from pydantic import ValidationError

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.records import DeviceSample, GpuProcessSample, HostProcess
from wattpipe.processors.attributes import AttributesConfig, AttributesProcessor

T = Timestamp(monotonic_s=1000.0, wall_s=1_767_225_600.0)
DEVICE = DeviceSample(time=T, device_id="GPU-0", device_name="H100", vendor="nvidia")
GPU_PROCESS = GpuProcessSample(time=T, device_id="GPU-0", pid=42)
HOST_PROCESS = HostProcess(time=T, pid=42, comm="python", exe="/usr/bin/python3")


def processor(*actions: dict[str, Any]) -> AttributesProcessor:
    return AttributesProcessor(AttributesConfig.model_validate({"actions": list(actions)}))


def run(*processors: AttributesProcessor) -> Batch:
    batch = Batch(time=T, interval_s=5.0, node="node-a").with_records([DEVICE, GPU_PROCESS, HOST_PROCESS])
    for p in processors:
        batch = p.process(batch)
    return batch


def test_insert_adds_a_missing_attribute_and_never_overwrites() -> None:
    batch = run(
        processor(
            {"action": "insert", "key": "cluster", "value": "prod"},
            {"action": "insert", "key": "device_name", "value": "overwritten?"},
        )
    )

    labels = batch.labels(DEVICE)
    assert labels["cluster"] == "prod"
    assert labels["device_name"] == "H100"
    assert batch.labels(HOST_PROCESS)["cluster"] == "prod"


def test_upsert_overwrites_an_existing_attribute_and_adds_a_missing_one() -> None:
    batch = run(
        processor(
            {"action": "upsert", "key": "device_name", "value": "gpu-a"},
            {"action": "upsert", "key": "region", "value": "eu"},
        )
    )

    assert batch.labels(DEVICE)["device_name"] == "gpu-a"
    assert batch.labels(DEVICE)["region"] == "eu"


def test_rename_moves_the_value_to_the_new_key_and_ignores_records_without_it() -> None:
    batch = run(processor({"action": "rename", "key": "comm", "new_key": "command"}))

    host = batch.labels(HOST_PROCESS)
    assert host["command"] == "python"
    assert "comm" not in host
    assert "command" not in batch.labels(DEVICE)


def test_drop_removes_the_attribute() -> None:
    batch = run(processor({"action": "drop", "key": "vendor"}, {"action": "drop", "key": "exe"}))

    assert batch.labels(DEVICE) == {"device_type": "gpu", "device_id": "GPU-0", "device_name": "H100"}
    assert batch.labels(HOST_PROCESS) == {"pid": "42", "comm": "python"}


def test_kinds_limits_an_action_to_records_of_those_kinds() -> None:
    batch = run(processor({"action": "drop", "key": "device_id", "kinds": ["process"]}))

    assert "device_id" not in batch.labels(GPU_PROCESS)
    assert batch.labels(DEVICE)["device_id"] == "GPU-0"


def test_actions_accumulate_across_two_processors_in_pipeline_order() -> None:
    insert = processor({"action": "insert", "key": "cluster", "value": "prod"})
    rename = processor({"action": "rename", "key": "cluster", "new_key": "env"})

    insert_then_rename = run(insert, rename)
    rename_then_insert = run(rename, insert)

    assert [a.op for a in insert_then_rename.label_actions] == ["insert", "rename"]
    assert insert_then_rename.labels(DEVICE)["env"] == "prod"
    assert "cluster" not in insert_then_rename.labels(DEVICE)
    assert rename_then_insert.labels(DEVICE)["cluster"] == "prod"
    assert "env" not in rename_then_insert.labels(DEVICE)


def test_process_leaves_records_present_and_the_input_batch_unchanged() -> None:
    before = run()
    after = processor({"action": "insert", "key": "cluster", "value": "prod"}).process(before)

    assert before.label_actions == ()
    assert "cluster" not in before.labels(DEVICE)
    assert after.devices is before.devices
    assert after.present == before.present == {"devices", "gpu_processes", "host_processes"}
    assert DEVICE.attributes().get("cluster") is None  # records stay as they were read


def test_numbers_and_booleans_as_values_become_text() -> None:
    config = AttributesConfig.model_validate(
        {
            "actions": [
                {"action": "insert", "key": "rack", "value": 42},
                {"action": "insert", "key": "spot", "value": True},
                {"action": "insert", "key": "weight", "value": 0.5},
            ]
        }
    )
    assert [a.value for a in config.actions] == ["42", "true", "0.5"]


def test_unquoted_env_reference_with_digits_is_an_attribute_value() -> None:
    registry = Registry.from_entry_points()
    text = textwrap.dedent(
        """
        receivers:
          custom/gpu: {class: "tests.helpers.components:CountingGpu"}
        processors:
          attributes/site:
            actions:
              - action: insert
                key: site
                value: ${env:SITE}
        exporters:
          console:
        service:
          node_name: node-a
          pipelines:
            metrics: {receivers: [custom/gpu], processors: [attributes/site], exporters: [console]}
        """
    )

    config = load_config_text(text, "test.yaml", registry, {"SITE": "4711"})

    site = config.processors["attributes/site"]
    assert isinstance(site, AttributesConfig)
    assert AttributesProcessor(site).actions[0].value == "4711"


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ({"action": "insert", "key": "cluster"}, "insert of 'cluster' needs a value"),
        ({"action": "upsert", "key": "cluster"}, "upsert of 'cluster' needs a value"),
        ({"action": "rename", "key": "comm"}, "rename of 'comm' needs new_key"),
        ({"action": "drop", "key": "exe", "value": "x"}, "drop takes no value"),
        ({"action": "rename", "key": "comm", "new_key": "command", "value": "x"}, "rename takes no value"),
        ({"action": "insert", "key": "cluster", "value": "a", "new_key": "b"}, "insert takes no new_key"),
        ({"action": "replace", "key": "cluster", "value": "a"}, "'insert', 'upsert', 'rename' or 'drop'"),
        ({"action": "drop", "key": ""}, "at least 1 character"),
        (
            {"action": "drop", "key": "exe", "kinds": ["gpu"]},
            "'device', 'process', 'container', 'pod', 'instance' or 'vm'",
        ),
    ],
)
def test_invalid_action_is_a_validation_error_saying_what_is_wrong(action: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        AttributesConfig.model_validate({"actions": [action]})
    assert message in str(info.value)


def test_an_empty_action_list_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="at least 1 item"):
        AttributesConfig.model_validate({"actions": []})
