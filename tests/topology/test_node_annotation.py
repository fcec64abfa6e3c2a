"""Exporter node_annotation: patches the node once per change, through a real (loopback) API server face."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.context import make_context
from tests.topology.test_agent import allocated, kep_batch, placement
from wattpipe.exporters.node_annotation import NodeAnnotationConfig, NodeAnnotationExporter
from wattpipe.pipeline.topology_annotation import ANNOTATION, decode


class _Api(BaseHTTPRequestHandler):
    patches: list[tuple[str, str, dict[str, Any]]] = []
    fail_next = 0

    def do_PATCH(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.patches.append((self.path, self.headers["Content-Type"], body))
        if _Api.fail_next:
            _Api.fail_next -= 1
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        answer = json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.path.rsplit("/", 1)[1]}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(answer.encode())

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str, dict[str, Any]]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    _Api.patches = []
    _Api.fail_next = 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "t",
            "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}],
            "users": [{"name": "u", "user": {}}],
        })
    )  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield _Api.patches
    server.shutdown()
    server.server_close()


def test_annotation_is_patched_only_when_it_changes(api: list[tuple[str, str, dict[str, Any]]]) -> None:
    exporter = NodeAnnotationExporter(
        NodeAnnotationConfig(), make_context("node_annotation", "exporter", node_name="v100-node-1")
    )
    processor = placement()
    busy = processor.process(kep_batch(allocations=allocated("GPU-2")))
    asyncio.run(exporter.export(busy))
    asyncio.run(exporter.export(busy))  # the same: no second patch
    freed = processor.process(kep_batch(allocations=()))
    asyncio.run(exporter.export(freed))
    assert [path for path, _, _ in api] == ["/api/v1/nodes/v100-node-1"] * 2
    assert all("merge-patch+json" in kind for _, kind, _ in api)
    first = decode(api[0][2]["metadata"]["annotations"][ANNOTATION])
    second = decode(api[1][2]["metadata"]["annotations"][ANNOTATION])
    assert first.free == (0, 1, 3, 4, 5, 6, 7)
    assert second.free == tuple(range(8))
    assert second.best == (0, 250, 590, 1080, 1320, 1710, 2190, 2920)
    assert first.best[1] == 250  # 6-7 still free


def test_nothing_is_written_without_set_scores(api: list[tuple[str, str, dict[str, Any]]]) -> None:
    exporter = NodeAnnotationExporter(NodeAnnotationConfig(node_name="x"), make_context("node_annotation", "exporter"))
    asyncio.run(exporter.export(placement().process(kep_batch())))  # no allocations answer: no scores
    assert api == []


def test_a_failed_patch_is_retried_at_the_next_tick(api: list[tuple[str, str, dict[str, Any]]]) -> None:
    exporter = NodeAnnotationExporter(NodeAnnotationConfig(node_name="x"), make_context("node_annotation", "exporter"))
    batch = placement().process(kep_batch(allocations=()))
    _Api.fail_next = 1
    with pytest.raises(Exception, match="500"):
        asyncio.run(exporter.export(batch))  # the runtime logs and counts the failed export
    asyncio.run(exporter.export(batch))  # the same annotation: written now, since the first never landed
    asyncio.run(exporter.export(batch))
    assert len(api) == 2
    assert decode(api[1][2]["metadata"]["annotations"][ANNOTATION]).free == tuple(range(8))
