"""OTLP end to end: one pipeline on a simulated node, exported to Prometheus and over OTLP gRPC and HTTP at once.

The node (two GPUs: time-sliced processes in one pod, a GPU shared by two pods' replicas, a host process)
serves its NVML, kubelet pod-resources, API server and /proc faces; the pipeline (nvml, podresources,
procfs → idle → attribution → k8s → energy) runs in-process on a stepped clock, one tick at a time. After
every tick the test scrapes the ``prometheus`` exporter (OpenTelemetry naming) on loopback and waits for
that tick's request at the test OTLP receiver from each ``otlp`` exporter, so every tick's OTLP points are
compared with the Prometheus text *of the same tick*: the same series, the same values (joules and watts on
both sides, per docs/otlp.md and docs/metrics.md), with OpenTelemetry attributes, resource and timestamps.
"""

from __future__ import annotations

import asyncio
import socket
import textwrap
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.otlp_receiver import CUMULATIVE, OtlpReceiver, ReceivedPoint, flatten, wait_until
from wattpipe import simulator
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.graph import build
from wattpipe.pipeline.runtime import Service
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.simulator.scenario import parse_scenario

NODE = "otlp-node"
TICKS = 25  # 0 … 120 s of node time, 5 s apart
SENDERS = ("grpc", "http")

SCENARIO: dict[str, Any] = {
    "node": {"name": NODE},
    "gpus": [
        {"model": "NVIDIA H100 80GB HBM3", "idle_w": 70, "max_w": 700},
        {"model": "NVIDIA A100-SXM4-80GB", "idle_w": 55, "max_w": 400},
    ],
    "pods": [
        {"name": "trainer-0", "namespace": "ml", "containers": [{"name": "main", "devices": [{"gpu": 0}]}]},
        {
            "name": "infer-a",
            "namespace": "serving",
            "containers": [{"name": "server", "devices": [{"resource": "nvidia.com/gpu.shared", "gpu": 1, "replica": 0}]}],
        },
        {
            "name": "infer-b",
            "namespace": "serving",
            "containers": [
                {"name": "engine", "runtime": "cri-o", "devices": [{"resource": "nvidia.com/gpu.shared", "gpu": 1, "replica": 1}]}
            ],
        },
    ],
    "processes": [
        # Idle first (so idle power is learned), then two time-sliced processes on GPU 0, one of which exits.
        {"pid": 4242, "comm": "python", "container": "ml/trainer-0/main", "gpu": 0, "dynamic_w": 400,
         "util": [[0, 0.8], [40, 0.3]], "start_s": 10},
        {"pid": 4243, "comm": "python", "container": "ml/trainer-0/main", "gpu": 0, "dynamic_w": 400,
         "util": [[0, 0.4]], "start_s": 12, "end_s": 70},
        # GPU 1 shared by two pods' replicas, plus a short host process.
        {"pid": 5100, "comm": "tritonserver", "container": "serving/infer-a/server", "gpu": 1, "dynamic_w": 300,
         "util": [[0, 0.5]], "start_s": 10},
        {"pid": 5200, "comm": "vllm", "container": "serving/infer-b/engine", "gpu": 1, "dynamic_w": 300,
         "util": [[0, 0.2], [50, 0.7]], "start_s": 30},
        {"pid": 7001, "comm": "nvidia-smi", "gpu": 1, "dynamic_w": 20, "util": [[0, 0.05]], "start_s": 20, "end_s": 26},
        {"pid": 812, "comm": "sshd", "cpu_cores": 0.05},
    ],
}  # fmt: skip

PIPELINE = """
receivers:
  nvml: {required: true}
  podresources: {endpoint: "@KUBELET@", extra_resources: [nvidia.com/gpu.shared]}
  procfs: {root: "@PROC@", cpu_time: true}  # no cpu_attribution here: asked outright for process.cpu.time
processors:
  idle:
  attribution:
  k8s:
  energy: {terminated_retention: 1h}
exporters:
  prometheus: {listen: "127.0.0.1:0", naming: otel}
  otlp/grpc:
    endpoint: "@GRPC@"
    insecure: true
    headers: {x-otlp-sender: grpc}
    timeout: 5
  otlp/http:
    endpoint: "@HTTP@"
    protocol: http/protobuf
    compression: gzip
    headers: {x-otlp-sender: http}
    service_instance_id: wattpipe-http-1
    timeout: 5
service:
  node_name: "@NODE@"
  telemetry: {listen: ""}
  pipelines:
    metrics:
      interval: 5s
      receivers: [nvml, podresources, procfs]
      processors: [idle, attribution, k8s, energy]
      exporters: [prometheus, otlp/grpc, otlp/http]
"""


@dataclass(frozen=True)
class Tick:
    batch: Batch
    wall_ns: int
    prometheus: str
    """What ``/metrics`` served right after the tick."""
    otlp: dict[str, list[ReceivedPoint]]
    """The tick's OTLP points, per sender."""


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        body: bytes = response.read()
    return body.decode("utf-8")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("otlp-e2e")
    clock = SteppedClock()
    scenario = parse_scenario(SCENARIO)
    with (
        OtlpReceiver() as receiver,
        simulator.install(scenario, clock) as node,
        pytest.MonkeyPatch.context() as env,
    ):
        kubelet = simulator.start_kubelet(node, socket_dir=tmp / "pod-resources")
        api = simulator.start_k8s_api(node)
        env.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp / "kubeconfig")))
        env.setenv("NODE_NAME", NODE)
        procfs = simulator.ProcfsWriter(node, tmp)
        procfs.refresh()  # /proc exists before the procfs receiver starts
        text = textwrap.dedent(PIPELINE)
        for key, value in {
            "@KUBELET@": kubelet.endpoint,
            "@PROC@": str(tmp / "proc"),
            "@GRPC@": receiver.grpc_endpoint,
            "@HTTP@": receiver.http_endpoint,
            "@NODE@": NODE,
        }.items():
            text = text.replace(key, value)
        registry = Registry.from_entry_points()
        graph = build(load_config_text(text, "otlp-e2e.yaml", registry, {}), registry, clock, Telemetry(clock))
        service = Service(graph, before_tick=procfs.refresh)
        (runner,) = service.runners
        k8s: Any = dict(runner.pipeline.processors)["k8s"]
        prometheus: Any = graph.exporters["prometheus"]

        async def go() -> list[Tick]:
            await service.start()
            ticks: list[Tick] = []
            try:
                # The pod watch runs on its own thread: every tick should know the pods by name.
                await asyncio.to_thread(wait_until, lambda: k8s.cache.view.synced, 20.0, "the pod cache to sync")
                for i in range(TICKS):
                    if i:
                        clock.advance(5.0)
                    batch = await runner.tick()
                    exposition = await asyncio.to_thread(scrape, prometheus.url)
                    otlp = {}
                    for sender in SENDERS:
                        requests = await asyncio.to_thread(receiver.wait_for_requests, i + 1, None, sender, 20.0)
                        assert len(requests) == i + 1, f"tick {i}: {len(requests)} {sender} requests"
                        otlp[sender] = flatten(requests[i:])
                    ticks.append(Tick(batch, batch.time.wall_ns, exposition, otlp))
            finally:
                await service.shutdown()
            return ticks

        ticks = asyncio.run(go())
        yield {"ticks": ticks, "scenario": scenario, "receiver": receiver}


# --- what the same tick looks like in both -----------------------------------------------------------

_UNIT_WORDS = {"W": "watts", "J": "joules", "s": "seconds"}


def prometheus_series(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = sample.value
    return out


def as_prometheus(point: ReceivedPoint) -> tuple[str, frozenset[tuple[str, str]]]:
    """The OpenTelemetry → Prometheus rule (docs/metrics.md): ``.`` → ``_``, the unit's word, ``_total`` for
    monotonic sums; attributes likewise, every value as text, and the resource's node as ``k8s_node_name``."""
    name = point.name.replace(".", "_")
    word = _UNIT_WORDS.get(point.unit)
    if word and not name.endswith(f"_{word}"):
        name = f"{name}_{word}"
    if point.kind == "sum" and point.monotonic:
        name += "_total"
    labels = {key.replace(".", "_"): str(value) for key, value in point.attributes.items()}
    labels["k8s_node_name"] = str(point.resource["k8s.node.name"])
    return name, frozenset(labels.items())


@pytest.mark.parametrize("sender", SENDERS)
def test_every_tick_otlp_carries_exactly_the_prometheus_series_and_values_of_that_tick(
    run: dict[str, Any], sender: str
) -> None:
    compared = 0
    for i, tick in enumerate(run["ticks"]):
        expected = prometheus_series(tick.prometheus)
        got = {as_prometheus(p): p.value for p in tick.otlp[sender]}
        assert set(got) == set(expected), f"tick {i}: series only in OTLP {set(got) - set(expected)}, only in " + (
            f"Prometheus {set(expected) - set(got)}"
        )
        for key, value in got.items():
            assert value == expected[key], (i, key)  # the same double: J and W on both sides
        compared += len(got)
    assert compared > 25 * 40  # dozens of series on every tick


def test_grpc_and_http_send_the_same_points(run: dict[str, Any]) -> None:
    def comparable(points: list[ReceivedPoint]) -> list[tuple[Any, ...]]:
        return sorted(
            (p.name, p.unit, p.kind, sorted(p.attributes.items()), p.start_ns, p.time_ns, p.value, p.temporality)
            for p in points
        )

    for tick in run["ticks"]:
        assert comparable(tick.otlp["grpc"]) == comparable(tick.otlp["http"])


def test_energy_is_in_joules_and_equals_the_integer_millijoule_totals(run: dict[str, Any]) -> None:
    last = run["ticks"][-1]
    points = {(p.name, p.attributes.get("hw.id"), p.attributes.get("process.pid")): p for p in last.otlp["grpc"]}
    for totals in last.batch.device_totals:
        p = points["hw.energy", totals.device_id, None]
        assert (p.unit, p.value) == ("J", totals.energy_mj / 1000)
        assert points["wattpipe.gpu.energy.idle", totals.device_id, None].value == totals.idle_energy_mj / 1000
    process_totals = [t for t in last.batch.totals if t.scope == "process"]
    assert {int(t.key) for t in process_totals} == {4242, 4243, 5100, 5200, 7001}
    for totals in process_totals:
        p = points["wattpipe.process.gpu.energy", totals.device_id, int(totals.key)]
        assert (p.unit, p.value) == ("J", totals.energy_mj / 1000)
        assert p.value > 0
    for power in last.batch.device_power:
        p = points["hw.power", power.device_id, None]
        assert (p.unit, p.value) == ("W", power.power_w)


# --- names, units, attributes, resource -----------------------------------------------------------

UNITS = {
    "hw.power": ("W", "gauge"),
    "hw.energy": ("J", "sum"),
    "wattpipe.gpu.power.idle": ("W", "gauge"),
    "wattpipe.gpu.power.idle.source": ("", "gauge"),
    "wattpipe.gpu.power.idle.uncertainty": ("W", "gauge"),
    "wattpipe.gpu.power.active": ("W", "gauge"),
    "wattpipe.gpu.power.unattributed": ("W", "gauge"),
    "wattpipe.gpu.energy.idle": ("J", "sum"),
    "wattpipe.gpu.energy.active": ("J", "sum"),
    "wattpipe.gpu.energy.unattributed": ("J", "sum"),
    "wattpipe.gpu.energy.held": ("J", "gauge"),
    "wattpipe.process.gpu.utilization": ("1", "gauge"),
    "wattpipe.process.gpu.energy": ("J", "sum"),
    "wattpipe.process.gpu.power": ("W", "gauge"),
    "wattpipe.container.gpu.energy": ("J", "sum"),
    "wattpipe.container.gpu.power": ("W", "gauge"),
    "wattpipe.pod.gpu.energy": ("J", "sum"),
    "wattpipe.pod.gpu.power": ("W", "gauge"),
    "wattpipe.device.up": ("", "gauge"),
    "wattpipe.gpu.info": ("", "gauge"),
    "wattpipe.gpu.attribution": ("", "gauge"),
    "process.cpu.time": ("s", "sum"),  # procfs reads every process's CPU time (cpu_time: true, set above)
}


def test_metric_names_units_and_kinds(run: dict[str, Any]) -> None:
    seen = {(p.name, p.unit, p.kind) for tick in run["ticks"] for p in tick.otlp["grpc"]}
    assert {name for name, _, _ in seen} == set(UNITS)  # no MIG GPU here: the instance families are absent
    for name, unit, kind in seen:
        assert (unit, kind) == UNITS[name], name
    for tick in run["ticks"]:
        for p in tick.otlp["http"]:
            assert p.scope == "wattpipe"
            if p.kind == "sum":
                assert (p.monotonic, p.temporality) == (True, CUMULATIVE), p.name


def last_points(run: dict[str, Any], name: str) -> list[ReceivedPoint]:
    return [p for p in run["ticks"][-1].otlp["grpc"] if p.name == name]


def test_device_attributes(run: dict[str, Any]) -> None:
    gpus = run["scenario"].gpus
    for name in ("hw.power", "hw.energy", "wattpipe.gpu.energy.active"):
        attributes = sorted((dict(p.attributes) for p in last_points(run, name)), key=lambda a: a["wattpipe.gpu.index"])
        assert attributes == [
            {"hw.id": gpu.uuid, "hw.type": "gpu", "hw.name": gpu.model, "hw.vendor": "nvidia", "wattpipe.gpu.index": i}
            for i, gpu in enumerate(gpus)
        ]


def test_process_container_and_pod_attributes(run: dict[str, Any]) -> None:
    scenario = run["scenario"]
    uuids = [g.uuid for g in scenario.gpus]
    pods = {f"{pod.namespace}/{pod.name}": pod for pod in scenario.pods}
    containers = {f"{pod.namespace}/{pod.name}/{c.name}": (pod, c) for pod in scenario.pods for c in pod.containers}
    processes = {p.pid: p for p in scenario.processes if p.gpu is not None}  # not sshd

    by_pid = {p.attributes["process.pid"]: p for p in last_points(run, "wattpipe.process.gpu.energy")}
    assert set(by_pid) == set(processes)
    for pid, point in by_pid.items():
        spec = processes[pid]
        a = point.attributes
        assert isinstance(pid, int)  # process.pid is an integer attribute
        assert a["process.command"] == spec.comm
        assert a["hw.id"] == uuids[spec.gpu]
        assert a["wattpipe.state"] == ("terminated" if spec.end_s is not None else "running")
        if spec.container:
            pod, container = containers[spec.container]
            assert (a["container.id"], a["k8s.pod.uid"]) == (container.id, pod.uid)
        else:
            assert "container.id" not in a  # a host process
            assert "k8s.pod.uid" not in a

    by_container = {
        p.attributes["container.id"]: p.attributes for p in last_points(run, "wattpipe.container.gpu.energy")
    }
    assert len(by_container) == 3
    for key, (pod, container) in containers.items():
        a = by_container[container.id]
        assert a["k8s.container.name"] == container.name, key
        assert (a["k8s.pod.name"], a["k8s.namespace.name"], a["k8s.pod.uid"]) == (pod.name, pod.namespace, pod.uid)
        assert a["container.runtime"] == container.runtime
    # Every joule of a container's processes is in its one series, the last tick of an exiting process
    # included (the driver still lists it, /proc no longer has it: it keeps the container it had).
    container_j = {p.attributes["container.id"]: p.value for p in last_points(run, "wattpipe.container.gpu.energy")}
    for key, (_pod, container) in containers.items():
        pids = [pid for pid, spec in processes.items() if spec.container == key]
        assert container_j[container.id] == pytest.approx(sum(by_pid[pid].value for pid in pids), abs=1e-9), key

    by_pod = {p.attributes["k8s.pod.uid"]: p.attributes for p in last_points(run, "wattpipe.pod.gpu.energy")}
    assert {uid: (a["k8s.pod.name"], a["k8s.namespace.name"]) for uid, a in by_pod.items()} == {
        pod.uid: (pod.name, pod.namespace) for pod in pods.values()
    }


def test_resource_attributes(run: dict[str, Any]) -> None:
    expected_instance = {"grpc": NODE, "http": "wattpipe-http-1"}  # the node by default; the option otherwise
    for tick in run["ticks"]:
        for sender in SENDERS:
            resources = {frozenset(p.resource.items()) for p in tick.otlp[sender]}
            assert len(resources) == 1  # one resource per request
            resource = dict(next(iter(resources)))
            assert resource["service.name"] == "wattpipe"
            assert resource["service.instance.id"] == expected_instance[sender]
            assert resource["host.name"] == socket.gethostname()
            assert resource["k8s.node.name"] == NODE
            # The node is the resource's, never a point attribute.
            assert all("k8s.node.name" not in p.attributes for p in tick.otlp[sender])


# --- timestamps -----------------------------------------------------------------------------------


@pytest.mark.parametrize("sender", SENDERS)
def test_times_are_the_read_times_and_start_times_stay_put(run: dict[str, Any], sender: str) -> None:
    ticks = run["ticks"]
    first_ns = ticks[0].wall_ns
    last_time: dict[Any, int] = {}
    starts: dict[Any, int] = {}
    for tick in ticks:
        for p in tick.otlp[sender]:
            series = p.series()
            # Every value was read on this tick (a stepped clock reads the tick's time everywhere).
            assert p.time_ns == tick.wall_ns, (series, p.time_ns, tick.wall_ns)
            assert p.time_ns > last_time.get(series, 0), series  # strictly increasing from export to export
            last_time[series] = p.time_ns
            if p.kind == "gauge":
                assert p.start_ns == 0, series  # gauges carry no start time
                continue
            assert first_ns <= p.start_ns <= p.time_ns, series
            assert starts.setdefault(series, p.start_ns) == p.start_ns, series  # a counter's start never moves
    # A device's totals began with the first tick. A process's began with the interval in which it was first
    # seen: its first point (the tick after it appeared, 0 J or more) starts one interval earlier.
    assert {s for (name, _), s in starts.items() if name == "hw.energy"} == {first_ns}
    first_seen: dict[int, int] = {}
    for tick in ticks:
        for p in tick.otlp[sender]:
            if p.name == "wattpipe.process.gpu.energy":
                first_seen.setdefault(int(p.attributes["process.pid"] or 0), p.time_ns)
    assert first_seen[5200] == first_ns + 30 * 10**9  # it starts at 30 s
    for (name, attributes), start in starts.items():
        if name == "wattpipe.process.gpu.energy":
            pid = int(dict(attributes)["process.pid"] or 0)
            assert start == first_seen[pid] - 5 * 10**9, pid


def test_the_exporters_kept_up(run: dict[str, Any]) -> None:
    receiver: OtlpReceiver = run["receiver"]
    for sender in SENDERS:
        assert receiver.count(sender=sender) == TICKS  # one request per tick, none lost, none repeated
        assert receiver.refused(sender=sender) == 0
