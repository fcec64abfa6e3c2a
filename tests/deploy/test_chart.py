"""The image, the Helm chart and the sidecar example, checked without docker, helm or a cluster."""

from __future__ import annotations

import io
import re
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.chart import CHART, DEPLOY, ROOT, load_yaml, render_config, unknown_fields, values
from wattpipe.cli import main

TEMPLATES = CHART / "templates"
INSTALLED = {ep.name for ep in entry_points(group="wattpipe.components")}


def validate(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    out, err = io.StringIO(), io.StringIO()
    code = main(["validate", "-c", str(path)], out, err)
    return code, out.getvalue(), err.getvalue()


def write(tmp_path: Path, cfg: dict[str, Any]) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def pipeline(cfg: dict[str, Any]) -> dict[str, Any]:
    metrics: dict[str, Any] = cfg["service"]["pipelines"]["metrics"]
    return metrics


# --- plain YAML ---------------------------------------------------------------------------------------


PLAIN_YAML = [
    CHART / "Chart.yaml",
    CHART / "values.yaml",
    CHART / "files" / "config.yaml",
    *sorted((DEPLOY / "examples").glob("*.yaml")),
]


@pytest.mark.parametrize("path", PLAIN_YAML, ids=[str(p.relative_to(DEPLOY)) for p in PLAIN_YAML])
def test_every_plain_yaml_file_parses_to_mappings(path: Path) -> None:
    docs = list(yaml.safe_load_all(path.read_text()))
    assert docs
    assert all(isinstance(doc, dict) and doc for doc in docs)


def test_chart_app_version_is_the_package_version() -> None:
    chart = load_yaml(CHART / "Chart.yaml")
    project = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert project is not None
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "wattpipe"
    assert chart["appVersion"] == project.group(1)  # the image tag the chart pulls by default


def test_values_defaults_schedule_on_gpu_nodes_only_with_opt_in_extras() -> None:
    v = values()
    assert v["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in v["tolerations"]
    assert v["driver"] == {
        "mode": "hostPath",
        "libraryPath": "/usr/lib/x86_64-linux-gnu",
        "runtimeClassName": "nvidia",
    }
    assert v["hostPID"] is True
    assert v["securityContext"]["runAsUser"] == 0
    assert v["securityContext"]["readOnlyRootFilesystem"] is True
    assert v["resources"]["requests"]
    assert v["resources"]["limits"]
    assert (v["k8s"]["enabled"], v["dcgm"]["enabled"], v["serviceMonitor"]["enabled"]) == (False, False, False)
    assert v["otlp"]["endpoint"] == ""
    assert v["podResources"]["hostPath"] == "/var/lib/kubelet/pod-resources"  # the directory, not the socket


def test_every_value_a_template_reads_is_defined_in_values_yaml() -> None:
    defined = values()
    read: set[str] = set()
    for path in TEMPLATES.iterdir():
        read |= set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", path.read_text()))
    assert read, "the templates read no values at all"
    for dotted in sorted(read):
        node: Any = defined
        for key in dotted.split("."):
            assert isinstance(node, dict), f".Values.{dotted}: {key} is under a value that is not a map"
            assert key in node, f".Values.{dotted} is not in values.yaml"
            node = node[key]


# --- the pipeline configuration -----------------------------------------------------------------------


def test_chart_config_file_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = validate(CHART / "files" / "config.yaml", monkeypatch)
    assert (code, err) == (0, "")
    assert "metrics (4 receivers, 4 processors, 1 exporters)" in out


def test_chart_config_matches_the_daemonset_mounts_and_ports() -> None:
    cfg = load_yaml(CHART / "files" / "config.yaml")
    daemonset = (TEMPLATES / "daemonset.yaml").read_text()
    assert cfg["receivers"]["procfs"]["root"] == "${env:WATTPIPE_PROC_ROOT:-/host/proc}"
    assert "mountPath: /host/proc" in daemonset
    assert cfg["receivers"]["rapl"]["root"] == "${env:WATTPIPE_SYS_ROOT:-/host/sys}"
    assert "mountPath: /host/sys" in daemonset
    endpoint = cfg["receivers"]["podresources"]["endpoint"]
    assert endpoint == "unix:///var/lib/kubelet/pod-resources/kubelet.sock"
    assert "mountPath: /var/lib/kubelet/pod-resources\n" in daemonset
    assert cfg["exporters"]["prometheus"]["listen"] == "0.0.0.0:28282"
    assert re.search(r"- name: metrics\n\s+containerPort: 28282\n", daemonset)
    assert cfg["service"]["telemetry"]["listen"] == "0.0.0.0:8888"  # reachable by the kubelet's probes
    assert re.search(r"- name: telemetry\n\s+containerPort: 8888\n", daemonset)
    assert "path: /healthz" in daemonset
    assert "path: /readyz" in daemonset
    assert cfg["service"]["node_name"] == "${env:NODE_NAME}"
    assert "fieldPath: spec.nodeName" in daemonset
    assert cfg["service"]["state"]["path"].startswith("/var/lib/wattpipe/")
    assert "mountPath: /var/lib/wattpipe\n" in daemonset


def test_default_config_uses_only_installed_component_types() -> None:
    cfg = render_config(values())
    used = {cid.split("/")[0] for kind in ("receivers", "processors", "exporters") for cid in cfg[kind]}
    assert used == {
        "nvml",
        "procfs",
        "podresources",
        "rapl",
        "idle",
        "attribution",
        "energy",
        "cpu_attribution",
        "prometheus",
    }
    assert used <= INSTALLED
    assert "otlp" not in (CHART / "files" / "config.yaml").read_text()


@pytest.mark.parametrize(
    ("overrides", "receivers"),
    [
        ({"cpu": {"enabled": False}}, ["nvml", "procfs", "podresources"]),
        ({"cpu": {"enabled": False}, "dcgm": {"enabled": True}}, ["nvml", "procfs", "podresources", "dcgm"]),
        (
            {
                "cpu": {"enabled": False},
                "dcgm": {"enabled": True, "config": {"endpoint": "http://10.0.3.7:9400/metrics", "timeout": "1s"}},
            },
            ["nvml", "procfs", "podresources", "dcgm"],
        ),
        ({"procfs": {"enabled": False}, "podResources": {"enabled": False}}, ["nvml"]),
        (
            {"podResources": {"enabled": False}, "dcgm": {"enabled": True}, "hostSys": {"enabled": False}},
            ["nvml", "procfs", "dcgm"],
        ),
    ],
    ids=["gpu-only", "dcgm-discovered", "dcgm-endpoint", "nvml-only", "no-kubelet-no-sys"],
)
def test_each_receiver_switch_renders_a_valid_pipeline(
    overrides: dict[str, Any], receivers: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = render_config(values(**overrides))
    assert pipeline(cfg)["receivers"] == receivers
    assert sorted(cfg["receivers"]) == sorted(receivers)
    assert pipeline(cfg)["processors"] == ["idle", "attribution", "energy"]
    code, out, err = validate(write(tmp_path, cfg), monkeypatch)
    assert (code, err) == (0, "")
    assert f"metrics ({len(receivers)} receivers, 3 processors, 1 exporters)" in out
    if "procfs" in receivers:  # without CPU attribution, procfs reads only new processes (the GPU path's mode)
        assert cfg["receivers"]["procfs"]["cpu_time"] is False


@pytest.mark.parametrize(
    "overrides",
    [{}, {"k8s": {"enabled": True}}, {"dcgm": {"enabled": True}, "topology": {"enabled": True}}],
    ids=["default", "k8s", "dcgm-topology"],
)
def test_cpu_is_on_by_default_after_the_gpu_processors(
    overrides: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = render_config(values(**overrides))
    assert "rapl" in pipeline(cfg)["receivers"]
    assert cfg["receivers"]["procfs"]["cpu_time"] is True
    processors = pipeline(cfg)["processors"]
    assert processors.index("cpu_attribution") > processors.index("energy")
    code, _, err = validate(write(tmp_path, cfg), monkeypatch)
    assert (code, err) == (0, "") or ("k8s" not in INSTALLED and "k8s" in err)


def test_k8s_switch_puts_the_processor_between_attribution_and_energy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = render_config(values(k8s={"enabled": True}))
    assert pipeline(cfg)["processors"] == ["idle", "attribution", "k8s", "energy", "cpu_attribution"]
    code, out, err = validate(write(tmp_path, cfg), monkeypatch)
    if "k8s" in INSTALLED:
        assert (code, err) == (0, "")
        assert "5 processors" in out
    else:  # not released yet: the reason the switch defaults to off
        assert code == 2
        assert "k8s" in err


def test_config_override_replaces_the_whole_pipeline() -> None:
    text = "receivers: {nvml: }\nexporters: {console: }\n"
    assert render_config(values(configOverride=text, dcgm={"enabled": True})) == {
        "receivers": {"nvml": None},
        "exporters": {"console": None},
    }


# --- the image ----------------------------------------------------------------------------------------


def dockerfile() -> str:
    return (DEPLOY / "Dockerfile").read_text()


def instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_dockerfile_builds_a_wheel_then_installs_it_on_slim_python() -> None:
    lines = instructions(dockerfile())
    froms = [line for line in lines if line.startswith("FROM ")]
    assert froms == ["FROM python:3.11-slim AS build", "FROM python:3.11-slim"]
    assert any(line.startswith("RUN pip wheel") and "--wheel-dir /wheels ." in line for line in lines)
    install = next(line for line in lines if "pip install" in line)
    assert "--no-index --find-links /wheels wattpipe" in install
    assert "from=build" in install


def test_dockerfile_runs_non_root_with_the_documented_entrypoint() -> None:
    lines = instructions(dockerfile())
    assert "USER 10001:10001" in lines
    assert lines.index("USER 10001:10001") < lines.index('ENTRYPOINT ["wattpipe"]')
    assert lines[-2:] == ['ENTRYPOINT ["wattpipe"]', 'CMD ["run", "-c", "/etc/wattpipe/config.yaml"]']
    assert "COPY configs/default.yaml /etc/wattpipe/config.yaml" in lines
    assert "chown 10001:10001 /var/lib/wattpipe" in dockerfile()  # the state file's directory
    healthcheck = next(line for line in lines if line.startswith("HEALTHCHECK"))
    assert "curl" not in healthcheck
    assert "http://127.0.0.1:8888/healthz" in healthcheck


def test_nvml_symlink_in_the_image_points_into_the_chart_driver_mount() -> None:
    text = dockerfile()
    link = re.search(r"ln -s (\S+)/libnvidia-ml\.so\.1 (\S+)/libnvidia-ml\.so\.1", text)
    assert link is not None
    target_dir, link_dir = link.groups()
    assert f"ENV LD_LIBRARY_PATH={link_dir} " in re.sub(r"\\\n\s*", " ", text)
    assert f"mountPath: {target_dir}  #" in (TEMPLATES / "daemonset.yaml").read_text()


def test_dockerfile_copies_every_package_and_the_ignore_file_lets_them_through() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    # wattpipe/ and every folder its symlinks reach (pipeline/, ..., configs/): COPY keeps the links.
    linked = {name.split(".")[1] for name in setuptools["packages"] if name.count(".") >= 1}
    assert all((ROOT / "wattpipe" / name).is_symlink() for name in linked)
    packages = {"wattpipe", *linked}
    copied = re.findall(r"^COPY (\w+) \./\1$", dockerfile(), re.M)
    assert set(copied) == packages
    allowed = {
        line[1:].rstrip("/")
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    rules = [line for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines() if line[:1] not in "#"]
    assert rules[0] == "*"  # an allow-list: everything else stays out of the build context
    assert {*packages, "pyproject.toml", "README.md"} == allowed
    assert all((ROOT / path).exists() for path in allowed)


# --- the sidecar example ------------------------------------------------------------------------------


def sidecar_docs() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((DEPLOY / "examples" / "sidecar.yaml").read_text())}


def test_sidecar_shares_the_pod_pid_namespace_without_host_access() -> None:
    pod = sidecar_docs()["Pod"]["spec"]
    assert pod["shareProcessNamespace"] is True
    assert "hostPID" not in pod
    assert "hostNetwork" not in pod
    assert all("hostPath" not in vol for vol in pod["volumes"])
    (sidecar,) = [c for c in pod["initContainers"] if c["name"] == "wattpipe"]
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["securityContext"]["runAsNonRoot"] is True
    assert sidecar["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    (workload,) = pod["containers"]
    assert workload["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_sidecar_config_validates_and_reads_its_own_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = sidecar_docs()
    text = docs["ConfigMap"]["data"]["config.yaml"]
    cfg = yaml.safe_load(text)
    assert cfg["receivers"]["procfs"]["root"] == "/proc"
    assert "podresources" not in cfg["receivers"]
    (sidecar,) = docs["Pod"]["spec"]["initContainers"]
    assert sidecar["readinessProbe"]["httpGet"]["port"] == int(cfg["service"]["telemetry"]["listen"].rsplit(":", 1)[1])
    path = tmp_path / "sidecar.yaml"
    path.write_text(text)
    code, out, err = validate(path, monkeypatch)
    assert (code, err) == (0, "")
    assert "metrics (2 receivers, 3 processors, 1 exporters)" in out


def test_sidecar_example_uses_only_kubernetes_api_fields() -> None:
    docs = sidecar_docs()
    assert set(docs) == {"ConfigMap", "Pod"}
    for doc in docs.values():
        assert unknown_fields(doc) == []
    broken = {**docs["Pod"], "spec": {**docs["Pod"]["spec"], "sharePidNamespace": True}}
    assert unknown_fields(broken) == ["Pod.spec.sharePidNamespace"]  # the check does catch a misspelling


def test_cpu_config_sets_the_cpu_attribution_processors_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cpu.config is cpu_attribution's options, as dcgm.config and k8s.config are theirs: the idle mode and
    # unseen: containers (docs/cpu.md) without a whole configOverride. Off with the CPU side.
    options = {"mode": "idle", "unseen": "containers"}
    cfg = render_config(values(cpu={"config": options}))
    assert cfg["processors"]["cpu_attribution"] == options
    code, _, err = validate(write(tmp_path, cfg), monkeypatch)
    assert (code, err) == (0, "")
    assert "cpu_attribution" not in render_config(values(cpu={"enabled": False, "config": options}))["processors"]
    assert render_config(values())["processors"]["cpu_attribution"] is None  # the default: the file's, as it is
