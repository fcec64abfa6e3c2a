"""The kubelet pod-resources protos: generated files match the .proto, and the wire contract holds."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor

from wattpipe.pipeline.proto.podresources.v1 import api_pb2, api_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
V1 = Path("wattpipe/pipeline/proto/podresources/v1")  # pipeline/ by its installed name


def _gen_protos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_generated_files_match_a_fresh_generation() -> None:
    gen = _gen_protos()
    assert gen.proto_files(ROOT) == [V1 / "api.proto"]
    assert gen.generated_files(ROOT) == [V1 / "api_pb2.py", V1 / "api_pb2.pyi", V1 / "api_pb2_grpc.py"]
    assert gen.check(ROOT) == [], "generated protos are stale or hand-edited: run python scripts/gen_protos.py"


def test_check_names_a_hand_edited_and_a_stale_file(tmp_path: Path) -> None:
    gen = _gen_protos()
    shutil.copytree(ROOT / "pipeline" / "proto", tmp_path / "wattpipe" / "pipeline" / "proto")
    grpc_module = tmp_path / V1 / "api_pb2_grpc.py"
    grpc_module.write_text(grpc_module.read_text() + "# hand edit\n")
    (tmp_path / V1 / "old_pb2.py").write_text("")
    (tmp_path / V1 / "api_pb2.pyi").unlink()
    assert gen.check(tmp_path) == [
        f"{V1 / 'api_pb2.pyi'}: missing (not generated yet)",
        f"{V1 / 'old_pb2.py'}: stale (no .proto generates it)",
        f"{V1 / 'api_pb2_grpc.py'}: differs from a fresh generation",
    ]


def test_generated_grpc_module_imports_messages_by_package_path() -> None:
    source = (ROOT / V1 / "api_pb2_grpc.py").read_text()
    assert "from wattpipe.pipeline.proto.podresources.v1 import api_pb2 as" in source
    assert api_pb2_grpc.PodResourcesListerStub.__module__ == "wattpipe.pipeline.proto.podresources.v1.api_pb2_grpc"
    assert "wattpipe.pipeline.proto.podresources.v1.api_pb2" in sys.modules


def test_service_and_package_names_are_the_kubelets() -> None:
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert api_pb2.DESCRIPTOR.package == "v1"
    assert service.full_name == "v1.PodResourcesLister"
    assert [(m.name, m.input_type.name, m.output_type.name) for m in service.methods] == [
        ("List", "ListPodResourcesRequest", "ListPodResourcesResponse"),
        ("GetAllocatableResources", "AllocatableResourcesRequest", "AllocatableResourcesResponse"),
        ("Get", "GetPodResourcesRequest", "GetPodResourcesResponse"),
    ]


def _numbers(message: Any) -> dict[str, int]:
    return {field.name: field.number for field in message.DESCRIPTOR.fields}


def _reserved(message_name: str) -> list[tuple[int, int]]:
    file_proto = descriptor_pb2.FileDescriptorProto()
    api_pb2.DESCRIPTOR.CopyToProto(file_proto)
    (message,) = [m for m in file_proto.message_type if m.name == message_name]
    return [(r.start, r.end) for r in message.reserved_range]  # end is exclusive


def test_field_numbers_are_the_wire_contract() -> None:
    assert _numbers(api_pb2.ContainerResources) == {
        "name": 1,
        "devices": 2,
        "cpu_ids": 3,
        "memory": 4,
        "dynamic_resources": 5,
    }
    assert _numbers(api_pb2.ContainerDevices) == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert _numbers(api_pb2.AllocatableResourcesResponse) == {"devices": 1, "cpu_ids": 2, "memory": 3}
    assert _numbers(api_pb2.NUMANode) == {"ID": 1}
    assert _numbers(api_pb2.ContainerMemory) == {"memory_type": 1, "size": 2, "topology": 3}
    assert _numbers(api_pb2.DynamicResource) == {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4}
    assert _reserved("DynamicResource") == [(1, 2)]  # field 1 was removed: reserved, never reused
    assert _reserved("ContainerResources") == []
    assert _numbers(api_pb2.ClaimResource) == {
        "cdi_devices": 1,
        "driver_name": 2,
        "pool_name": 3,
        "device_name": 4,
        "share_id": 5,
    }
    assert _numbers(api_pb2.GetPodResourcesRequest) == {"pod_name": 1, "pod_namespace": 2}


def test_field_types_and_presence() -> None:
    fields = api_pb2.ContainerResources.DESCRIPTOR.fields_by_name
    assert fields["cpu_ids"].type == FieldDescriptor.TYPE_INT64
    assert fields["dynamic_resources"].message_type.full_name == "v1.DynamicResource"
    assert api_pb2.ContainerMemory.DESCRIPTOR.fields_by_name["size"].type == FieldDescriptor.TYPE_UINT64
    share_id = api_pb2.ClaimResource.DESCRIPTOR.fields_by_name["share_id"]
    assert share_id.has_presence
    assert not api_pb2.ClaimResource.DESCRIPTOR.fields_by_name["pool_name"].has_presence
    claim = api_pb2.ClaimResource(driver_name="gpu.nvidia.com")
    assert not claim.HasField("share_id")
    claim.share_id = ""
    assert claim.HasField("share_id")  # explicitly empty is not the same as absent


def test_list_response_round_trips_through_the_wire_format() -> None:
    response = api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                name="trainer-0",
                namespace="ml",
                containers=[
                    api_pb2.ContainerResources(
                        name="main",
                        devices=[
                            api_pb2.ContainerDevices(
                                resource_name="nvidia.com/gpu",
                                device_ids=["GPU-11111111-2222-3333-4444-555555555555::2"],
                                topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=1)]),
                            )
                        ],
                        cpu_ids=[4, 5],
                        memory=[api_pb2.ContainerMemory(memory_type="memory", size=2**33)],
                        dynamic_resources=[
                            api_pb2.DynamicResource(
                                claim_name="gpu-claim",
                                claim_namespace="ml",
                                claim_resources=[
                                    api_pb2.ClaimResource(
                                        cdi_devices=[api_pb2.CDIDevice(name="nvidia.com/gpu=gpu-0")],
                                        driver_name="gpu.nvidia.com",
                                        pool_name="node-1",
                                        device_name="gpu-0",
                                        share_id="c0ffee",
                                    )
                                ],
                            )
                        ],
                    )
                ],
            )
        ]
    )
    wire = response.SerializeToString()
    # Field 1 of the response (pod_resources), length-delimited: tag byte (1 << 3) | 2.
    assert wire[0] == 0x0A
    decoded = api_pb2.ListPodResourcesResponse.FromString(wire)
    assert decoded == response
    container = decoded.pod_resources[0].containers[0]
    assert (decoded.pod_resources[0].namespace, container.name) == ("ml", "main")
    assert list(container.devices[0].device_ids) == ["GPU-11111111-2222-3333-4444-555555555555::2"]
    assert [node.ID for node in container.devices[0].topology.nodes] == [1]
    assert list(container.cpu_ids) == [4, 5]
    assert container.memory[0].size == 8_589_934_592
    claim = container.dynamic_resources[0].claim_resources[0]
    assert (claim.device_name, claim.share_id, claim.HasField("share_id")) == ("gpu-0", "c0ffee", True)
    assert claim.cdi_devices[0].name == "nvidia.com/gpu=gpu-0"


def test_get_request_encodes_pod_name_as_field_1_and_namespace_as_field_2() -> None:
    wire = api_pb2.GetPodResourcesRequest(pod_name="ab", pod_namespace="c").SerializeToString()
    assert wire == b"\x0a\x02ab\x12\x01c"
