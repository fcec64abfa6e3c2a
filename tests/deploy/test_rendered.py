"""The chart's templates rendered without helm (tests/deploy/gotemplate.py), and the manifests checked."""

from __future__ import annotations

import functools
import hashlib
import io
import shutil
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.chart import CHART, ROOT, render_config, unknown_fields, values
from tests.deploy.gotemplate import TemplateError, render_chart, render_string
from wattpipe.cli import main

NAMESPACE = "monitoring"
INSTALLED = {ep.name for ep in entry_points(group="wattpipe.components")}
OTLP = "http://otel-collector.observability:4317"

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "service-monitor": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}, "interval": "30s"}
    },
    "dcgm": {"dcgm": {"enabled": True, "config": {"endpoint": "http://10.0.3.7:9400/metrics"}}},
    "dcgm-discovered": {"dcgm": {"enabled": True}},
    "k8s": {"k8s": {"enabled": True}},
    "cpu-options": {"cpu": {"config": {"mode": "idle", "unseen": "containers"}}},
    "k8s-dcgm": {"k8s": {"enabled": True}, "dcgm": {"enabled": True}},
    "dra": {"dra": {"enabled": True}, "k8s": {"enabled": True}},
    "runtime-class": {"driver": {"mode": "runtimeClass"}},
    "otlp": {"otlp": {"endpoint": OTLP}},
    "nvml-only": {"procfs": {"enabled": False}, "podResources": {"enabled": False}, "hostSys": {"enabled": False}},
    "override": {"configOverride": (ROOT / "configs" / "default.yaml").read_text(), "dcgm": {"enabled": True}},
    "extras": {
        "image": {"repository": "registry.example.com/wattpipe", "tag": "0.1.0-rc1"},
        "imagePullSecrets": [{"name": "regcred"}],
        "priorityClassName": "system-node-critical",
        "podAnnotations": {"example.com/team": "gpu"},
        "podLabels": {"tier": "monitoring"},
        "extraEnv": [{"name": "EXTRA", "value": "1"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}},
        "service": {"annotations": {"example.com/scrape": "true"}},
        "state": {"hostPath": ""},
        "driver": {"libraryPath": "/run/nvidia/driver/usr/lib/x86_64-linux-gnu"},
    },
    "no-rbac": {"serviceAccount": {"create": False}, "rbac": {"create": False}},
}


@functools.cache
def rendered(variant: str) -> dict[str, str]:
    return render_chart(CHART, VARIANTS[variant], namespace=NAMESPACE)


@functools.cache
def objects(variant: str) -> dict[str, dict[str, Any]]:
    """The rendered objects by kind (the chart makes at most one of each)."""
    docs = [
        doc for name, text in rendered(variant).items() if name.endswith(".yaml") for doc in yaml.safe_load_all(text)
    ]
    by_kind = {doc["kind"]: doc for doc in docs if doc is not None}
    assert len(by_kind) == len([doc for doc in docs if doc is not None])
    return by_kind


def pod_spec(variant: str) -> dict[str, Any]:
    spec: dict[str, Any] = objects(variant)["DaemonSet"]["spec"]["template"]["spec"]
    return spec


def container(variant: str) -> dict[str, Any]:
    (only,) = pod_spec(variant)["containers"]
    assert isinstance(only, dict)
    return only


def env(variant: str) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container(variant)["env"]}


def host_paths(variant: str) -> dict[str, dict[str, Any]]:
    return {v["name"]: v["hostPath"] for v in pod_spec(variant)["volumes"] if "hostPath" in v}


def mounts(variant: str) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container(variant)["volumeMounts"]}


def config_text(variant: str) -> str:
    text: str = objects(variant)["ConfigMap"]["data"]["config.yaml"]
    return text


# --- every variant ------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_manifest_parses_to_objects_with_known_fields(variant: str) -> None:
    out = rendered(variant)
    assert set(out) == {"NOTES.txt", *(p.name for p in (CHART / "templates").glob("[!_]*.yaml"))}
    for name, text in out.items():
        assert "<no value>" not in text, name
        for doc in yaml.safe_load_all(text) if name.endswith(".yaml") else []:
            if doc is None:  # an empty document: a switched-off template
                continue
            assert {"apiVersion", "kind", "metadata"} <= set(doc), name
            assert unknown_fields(doc) == [], name
            assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == "wattpipe"
            cluster_scoped = doc["kind"] in ("ClusterRole", "ClusterRoleBinding")
            assert doc["metadata"].get("namespace") == (None if cluster_scoped else NAMESPACE), name


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_config_is_the_mirrored_pipeline_and_validates(
    variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = config_text(variant)
    assert yaml.safe_load(text) == render_config(values(**VARIANTS[variant]))  # tests/deploy/chart.py agrees
    path = tmp_path / "config.yaml"
    path.write_text(text)
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    err = io.StringIO()
    code = main(["validate", "-c", str(path)], io.StringIO(), err)
    if "k8s" in variant and "k8s" not in INSTALLED:
        assert code == 2  # the processor is not released yet: the reason k8s.enabled defaults to false
        assert "k8s" in err.getvalue()
    else:
        assert (code, err.getvalue()) == (0, "")


def test_config_checksum_annotation_rolls_the_pods_when_the_config_changes() -> None:
    sums = {}
    for variant in ("default", "dcgm", "k8s", "override"):
        annotations = objects(variant)["DaemonSet"]["spec"]["template"]["metadata"]["annotations"]
        text = VARIANTS[variant].get("configOverride") or config_text(variant).removesuffix("\n")  # `|` adds one
        assert annotations["checksum/config"] == hashlib.sha256(text.encode()).hexdigest()
        sums[variant] = annotations["checksum/config"]
    assert len(set(sums.values())) == len(sums)


# --- the DaemonSet ------------------------------------------------------------------------------------


def test_default_objects_are_the_daemonset_its_config_rbac_and_headless_service() -> None:
    assert set(objects("default")) == {
        "ConfigMap",
        "DaemonSet",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
    }
    assert objects("default")["Service"]["spec"]["clusterIP"] == "None"


def test_default_daemonset_has_the_host_access_the_receivers_need() -> None:
    spec = pod_spec("default")
    assert spec["hostPID"] is True
    assert "runtimeClassName" not in spec
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    expected = {  # volume: (host path, its type, the path inside the container)
        "host-proc": ("/proc", "Directory", "/host/proc"),
        "host-sys": ("/sys", "Directory", "/host/sys"),
        "pod-resources": ("/var/lib/kubelet/pod-resources", "Directory", "/var/lib/kubelet/pod-resources"),
        "nvidia-lib": ("/usr/lib/x86_64-linux-gnu", "Directory", "/host/nvidia-lib"),
    }
    for name, (host, kind, inside) in expected.items():
        assert host_paths("default")[name] == {"path": host, "type": kind}
        assert mounts("default")[name] == {"name": name, "mountPath": inside, "readOnly": True}
    assert mounts("default")["config"]["readOnly"] is True
    assert host_paths("default")["state"] == {"path": "/var/lib/wattpipe", "type": "DirectoryOrCreate"}
    assert "readOnly" not in mounts("default")["state"]


def test_default_container_env_ports_probes_resources_and_privileges() -> None:
    c = container("default")
    assert c["image"] == "wattpipe:0.1.0"  # the chart's appVersion
    assert c["args"] == ["run", "-c", "/etc/wattpipe/config.yaml"]
    assert env("default")["NODE_NAME"] == {
        "name": "NODE_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }
    assert {k: e.get("value") for k, e in env("default").items() if k != "NODE_NAME"} == {
        "WATTPIPE_PROC_ROOT": "/host/proc",
        "WATTPIPE_INTERVAL": "5s",
        "WATTPIPE_LOG_LEVEL": "info",
    }
    assert c["ports"] == [{"name": "metrics", "containerPort": 28282}, {"name": "telemetry", "containerPort": 8888}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "telemetry"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "telemetry"}
    assert c["resources"]["requests"] == {"cpu": "50m", "memory": "128Mi"}
    assert c["resources"]["limits"] == {"cpu": "500m", "memory": "512Mi"}
    assert c["securityContext"]["privileged"] is True  # hostPath mode: /dev/nvidia* without the runtime
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert pod_spec("default")["terminationGracePeriodSeconds"] == 30


def test_daemonset_selects_its_own_pods_and_mounts_its_configmap() -> None:
    ds = objects("default")["DaemonSet"]
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "wattpipe", "app.kubernetes.io/instance": "wattpipe"}
    assert ds["spec"]["template"]["metadata"]["labels"] == selector
    (config,) = [v for v in pod_spec("default")["volumes"] if v["name"] == "config"]
    assert config["configMap"]["name"] == objects("default")["ConfigMap"]["metadata"]["name"]
    assert objects("default")["Service"]["spec"]["selector"] == selector


def test_runtime_class_mode_is_not_privileged_and_mounts_no_driver() -> None:
    assert pod_spec("runtime-class")["runtimeClassName"] == "nvidia"
    assert "privileged" not in container("runtime-class")["securityContext"]
    assert "nvidia-lib" not in host_paths("runtime-class")
    assert "nvidia-lib" not in mounts("runtime-class")
    assert {"host-proc", "host-sys", "pod-resources"} <= set(host_paths("runtime-class"))
    assert env("runtime-class")["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env("runtime-class")["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert "NVIDIA_VISIBLE_DEVICES" not in env("default")


def test_switched_off_receivers_drop_their_mounts() -> None:
    assert set(host_paths("nvml-only")) == {"state", "nvidia-lib"}
    assert set(mounts("nvml-only")) == {"config", "state", "nvidia-lib"}
    assert list(yaml.safe_load(config_text("nvml-only"))["receivers"]) == ["nvml"]


def test_extra_values_reach_the_pod() -> None:
    spec, c = pod_spec("extras"), container("extras")
    template = objects("extras")["DaemonSet"]["spec"]["template"]
    assert c["image"] == "registry.example.com/wattpipe:0.1.0-rc1"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["affinity"] == VARIANTS["extras"]["affinity"]
    assert template["metadata"]["annotations"]["example.com/team"] == "gpu"
    assert template["metadata"]["labels"]["tier"] == "monitoring"
    assert "tier" not in objects("extras")["DaemonSet"]["spec"]["selector"]["matchLabels"]
    assert env("extras")["EXTRA"] == {"name": "EXTRA", "value": "1"}
    assert host_paths("extras")["nvidia-lib"]["path"] == "/run/nvidia/driver/usr/lib/x86_64-linux-gnu"
    assert {"name": "state", "emptyDir": {}} in spec["volumes"]
    assert objects("extras")["Service"]["metadata"]["annotations"] == {"example.com/scrape": "true"}


# --- RBAC ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "namespace", "fullname"),
    [("wattpipe", NAMESPACE, "wattpipe"), ("energy", "gpu-ops", "energy-wattpipe")],
)
def test_the_daemonset_runs_as_a_service_account_bound_to_read_pods(
    release: str, namespace: str, fullname: str
) -> None:
    docs = [
        doc
        for name, text in render_chart(CHART, {}, release_name=release, namespace=namespace).items()
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    by_kind = {doc["kind"]: doc for doc in docs}
    account, role, binding = by_kind["ServiceAccount"], by_kind["ClusterRole"], by_kind["ClusterRoleBinding"]
    assert account["metadata"] == {**account["metadata"], "name": fullname, "namespace": namespace}
    assert by_kind["DaemonSet"]["spec"]["template"]["spec"]["serviceAccountName"] == fullname
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": fullname}
    assert role["metadata"]["name"] == fullname
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": fullname, "namespace": namespace}]


def test_the_api_token_is_mounted_only_for_the_components_that_read_pods() -> None:
    token = {v: pod_spec(v)["automountServiceAccountToken"] for v in ("default", "dcgm", "k8s", "k8s-dcgm")}
    assert token == {"default": False, "dcgm": True, "k8s": True, "k8s-dcgm": True}


def test_without_rbac_the_pod_uses_the_default_service_account() -> None:
    assert not {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} & set(objects("no-rbac"))
    assert pod_spec("no-rbac")["serviceAccountName"] == "default"
    named = render_chart(CHART, {"serviceAccount": {"create": False, "name": "gpu-reader"}})["daemonset.yaml"]
    assert yaml.safe_load(named)["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-reader"


# --- ServiceMonitor, OTLP, NOTES ----------------------------------------------------------------------


def test_service_monitor_only_when_enabled_and_it_scrapes_both_ports() -> None:
    assert [doc for doc in yaml.safe_load_all(rendered("default")["servicemonitor.yaml"]) if doc] == []
    monitor = objects("service-monitor")["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"] == objects("default")["Service"]["spec"]["selector"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s"},
        {"port": "telemetry", "path": "/metrics", "interval": "30s"},
    ]
    service_ports = [(p["name"], p["port"], p["targetPort"]) for p in objects("default")["Service"]["spec"]["ports"]]
    assert service_ports == [("metrics", 28282, "metrics"), ("telemetry", 8888, "telemetry")]


def test_otlp_endpoint_is_passed_to_the_container_only_when_set() -> None:
    assert "WATTPIPE_OTLP_ENDPOINT" not in env("default")
    assert env("otlp")["WATTPIPE_OTLP_ENDPOINT"] == {"name": "WATTPIPE_OTLP_ENDPOINT", "value": OTLP}
    assert OTLP not in config_text("otlp")  # no pipeline sends OTLP yet (values.yaml, docs/deployment.md)
    assert "otlp.endpoint is passed as WATTPIPE_OTLP_ENDPOINT" in rendered("otlp")["NOTES.txt"]
    assert "WATTPIPE_OTLP_ENDPOINT" not in rendered("default")["NOTES.txt"]


def test_notes_name_the_release_and_warn_about_the_switches() -> None:
    notes = rendered("default")["NOTES.txt"]
    assert "rollout status daemonset/wattpipe" in notes
    assert f"kubectl -n {NAMESPACE} get pods -l app.kubernetes.io/instance=wattpipe" in notes
    assert "nvidia.com/gpu.present:" in notes.splitlines()[0]
    assert "NVML comes from the host's /usr/lib/x86_64-linux-gnu" in notes
    assert "NVML comes from" not in rendered("runtime-class")["NOTES.txt"]
    assert "WARNING: k8s.enabled=true" in rendered("k8s")["NOTES.txt"]
    assert "or let the ServiceMonitor do it" in rendered("service-monitor")["NOTES.txt"]


# --- the renderer itself ------------------------------------------------------------------------------


def test_an_unknown_function_in_a_chart_template_fails_loudly(tmp_path: Path) -> None:
    chart = tmp_path / "wattpipe"
    shutil.copytree(CHART, chart)
    with (chart / "templates" / "service.yaml").open("a") as f:
        f.write('  secret: {{ "x" | b64enc }}\n')
    with pytest.raises(TemplateError, match=r'service\.yaml:24: function "b64enc" not supported'):
        render_chart(chart, {})


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{{ .x | tpl . }}", 'function "tpl" not supported'),
        ('{{ template "x" . }}', "unsupported or misplaced {{ template }}"),
        ("{{ if .x }}open", "an {{ end }} is missing"),
        ("{{ .missing.field }}", "nil pointer evaluating .field"),
        ("{{ (.x).y }}", "field of a parenthesised pipeline"),
        ('{{ eq .x "1" }}', "incompatible types for comparison"),
        ('{{ printf "%x" .x }}', "unsupported verb %x"),
        ('{{ include "nowhere" . }}', "no template 'nowhere'"),
        ("{{ $y = 1 }}", "undefined variable \\$y"),
    ],
)
def test_the_renderer_rejects_what_it_does_not_support(template: str, error: str) -> None:
    with pytest.raises(TemplateError, match=error):
        render_string(template, {"x": 1})


def test_capabilities_are_not_provided(tmp_path: Path) -> None:
    chart = tmp_path / "wattpipe"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "extra.yaml").write_text("v: {{ .Capabilities.KubeVersion.Version }}\n")
    with pytest.raises(TemplateError, match=r"extra\.yaml:1: can't evaluate field Capabilities"):
        render_chart(chart, {})


@pytest.mark.parametrize(
    ("template", "output"),
    [
        ("a  {{- 1 -}}  \n b", "a1b"),
        ("{{/* note */}}x{{- /* trimmed */ -}}  y", "xy"),
        ("{{ if eq .n 2 }}two{{ else if eq .n 3 }}three{{ else }}other{{ end }}", "three"),
        ("{{ range $k, $v := .m }}{{ $k }}={{ $v }};{{ end }}", "a=1;b=2;"),
        ("{{ range $i, $v := .l }}{{ $i }}{{ . }}{{ else }}empty{{ end }}", "0x1y"),
        ("{{ range .none }}x{{ else }}empty{{ end }}", "empty"),
        ("{{ $s := list }}{{ range .l }}{{ $s = append $s . }}{{ end }}{{ $s }}", "[x y]"),
        ("{{ with .m }}{{ .a }}{{ $.n }}{{ end }}{{ with .none }}x{{ end }}", "13"),
        ("{{ .big }} {{ .n }} {{ .half }} {{ true }} {{ .none }}", "1e+06 3 0.5 true "),
        ('{{ .s | quote }} {{ default "d" .none }} {{ .s | default "d" }}', '"a\\"b" d a"b'),
        ('{{ printf "%s-%d%%" "x" 7 }} {{ "abc-" | trunc 4 | trimSuffix "-" }} {{ trunc -2 "abc" }}', "x-7% abc bc"),
        ("{{ .m | toYaml | nindent 2 }}", "\n  a: 1\n  b: 2"),
        ('{{ dict "k" .l | toYaml }} {{ without .l "x" }}', "k:\n- x\n- y [y]"),
        ('{{ $d := dict }}{{ $_ := set $d "a" 1 }}{{ $_ := unset $d "a" }}{{ $d }}', "map[]"),
        ('{{ if contains "at" "wattpipe" }}{{ replace "t" "T" "wattpipe" }}{{ end }}', "waTTpipe"),
        ('{{- define "x" -}}[{{ . }}]{{- end -}}{{ include "x" .n }}', "[3]"),
        (
            '{{ or 0 "" .n }} {{ not .none }} {{ $y := "a: [1]" | fromYaml }}{{ $y.a }} {{ "  t " | trim }}',
            "3 true [1] t",
        ),
    ],
)
def test_the_renderer_follows_go_templates(template: str, output: str) -> None:
    data = {"n": 3, "m": {"b": 2, "a": 1}, "l": ["x", "y"], "s": 'a"b', "big": 1000000, "half": 0.5}
    assert render_string(template, data) == output
