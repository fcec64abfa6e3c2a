"""The Helm chart's pipeline configuration, rendered without helm.

``render_config`` repeats, step for step, what ``wattpipe.config`` in
``deploy/helm/wattpipe/templates/_helpers.tpl`` does to ``files/config.yaml``; ``test_helm.py`` checks
the two agree wherever a ``helm`` binary is installed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "wattpipe"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def values(**overrides: Any) -> dict[str, Any]:
    """The chart's values.yaml with ``overrides`` merged in, as ``helm --set``/``-f`` would."""
    return merged(load_yaml(CHART / "values.yaml"), overrides)


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def render_config(v: dict[str, Any]) -> dict[str, Any]:
    """The ConfigMap's config.yaml for values ``v``, as a parsed document."""
    if v["configOverride"]:
        return yaml.safe_load(v["configOverride"])
    cfg = load_yaml(CHART / "files" / "config.yaml")
    metrics = cfg["service"]["pipelines"]["metrics"]
    for name, on in {"procfs": v["procfs"]["enabled"], "podresources": v["podResources"]["enabled"]}.items():
        if not on:
            del cfg["receivers"][name]
            metrics["receivers"] = [r for r in metrics["receivers"] if r != name]
    if not (v["cpu"]["enabled"] and v["hostSys"]["enabled"] and v["procfs"]["enabled"]):
        del cfg["receivers"]["rapl"]
        metrics["receivers"] = [r for r in metrics["receivers"] if r != "rapl"]
        del cfg["processors"]["cpu_attribution"]
        metrics["processors"] = [p for p in metrics["processors"] if p != "cpu_attribution"]
        if v["procfs"]["enabled"]:
            cfg["receivers"]["procfs"]["cpu_time"] = False
    if "cpu_attribution" in cfg["processors"] and v["cpu"].get("config"):
        cfg["processors"]["cpu_attribution"] = v["cpu"]["config"]
    if v["dcgm"]["enabled"]:
        cfg["receivers"]["dcgm"] = v["dcgm"]["config"]
        metrics["receivers"] = [*metrics["receivers"], "dcgm"]
    if v.get("dra", {}).get("enabled"):
        cfg["receivers"]["dra"] = v["dra"]["config"]
        metrics["receivers"] = [*metrics["receivers"], "dra"]
    if v["k8s"]["enabled"]:
        cfg["processors"]["k8s"] = v["k8s"]["config"]
        processors: list[str] = []
        for p in metrics["processors"]:
            if p == "energy":
                processors.append("k8s")
            processors.append(p)
        metrics["processors"] = processors
    if v.get("topology", {}).get("enabled"):
        cfg["receivers"]["gpu_topology"] = {}
        metrics["receivers"] = [*metrics["receivers"], "gpu_topology"]
        cfg["processors"]["gpu_placement"] = {}
        metrics["processors"] = [*metrics["processors"], "gpu_placement"]
        if v["topology"]["annotateNode"]:
            cfg["exporters"]["node_annotation"] = {}
            metrics["exporters"] = [*metrics["exporters"], "node_annotation"]
    return cfg


def unknown_fields(obj: dict[str, Any]) -> list[str]:
    """Fields of a Kubernetes object that its API type does not have (a typo, or a key at the wrong level).

    Uses the models of the ``kubernetes`` client (a wattpipe dependency); kinds it does not model (CRDs such
    as ServiceMonitor) are not checked.
    """
    from kubernetes.client import models

    kind = getattr(models, f"V1{obj['kind']}", None)
    if kind is None:
        return []
    errors: list[str] = []
    _check(obj, kind.__name__, obj["kind"], errors, models)
    return errors


def _check(value: Any, type_name: str, path: str, errors: list[str], models: Any) -> None:
    if type_name.startswith("list["):
        for i, item in enumerate(value if isinstance(value, list) else []):
            _check(item, type_name[5:-1], f"{path}[{i}]", errors, models)
        return
    model = getattr(models, type_name, None)
    if model is None or not isinstance(value, dict):  # a primitive, a map of primitives, or a free-form object
        return
    by_json_name = {json_name: attr for attr, json_name in model.attribute_map.items()}
    for key, item in value.items():
        if key not in by_json_name:
            errors.append(f"{path}.{key}")
        else:
            _check(item, model.openapi_types[by_json_name[key]], f"{path}.{key}", errors, models)
