"""Web config (exporter-toolkit format): basic auth, TLS and client certificates on a real loopback listener."""

from __future__ import annotations

import io
import shutil
import ssl
import subprocess
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest
import yaml

from tests.helpers.context import make_context
from wattpipe.cli import EXIT_CONFIG, main
from wattpipe.exporters.prometheus import PrometheusConfig, PrometheusExporter
from wattpipe.pipeline.clock import SteppedClock
from wattpipe.pipeline.config import ConfigError
from wattpipe.pipeline.httpserver import HttpServer
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.pipeline.webconfig import WebConfig, load_web_config, serve

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")


def hello(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello\n"]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return str(path)


@pytest.fixture
def running() -> Iterator[Callable[[WebConfig | None], HttpServer]]:
    servers: list[HttpServer] = []

    def start(web: WebConfig | None) -> HttpServer:
        server = serve("127.0.0.1:0", hello, web)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


def self_signed(tmp_path: Path, name: str, san: str | None) -> tuple[Path, Path]:
    cert, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    args = ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    args += ["-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}"]
    if san:
        args += ["-addext", f"subjectAltName={san}"]
    openssl(*args)
    return cert, key


# --- basic auth --------------------------------------------------------------------------------


@pytest.fixture
def auth_web(tmp_path: Path) -> WebConfig:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
    return load_web_config(write(tmp_path, f"basic_auth_users:\n  prom: '{hashed}'\n"))


def test_basic_auth_without_credentials_is_401_with_a_challenge(running: Any, auth_web: WebConfig) -> None:
    response = httpx.get(running(auth_web).url + "/metrics")
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Basic realm="wattpipe"'


def test_basic_auth_wrong_password_or_unknown_user_is_401(running: Any, auth_web: WebConfig) -> None:
    url = running(auth_web).url
    assert httpx.get(url, auth=("prom", "wrong")).status_code == 401
    assert httpx.get(url, auth=("nobody", "s3cret")).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Basic !!notbase64"}).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer s3cret"}).status_code == 401
    assert httpx.get(url, auth=("prom", "x" * 100)).status_code == 401  # over bcrypt's 72 bytes


def test_basic_auth_right_password_is_200(running: Any, auth_web: WebConfig) -> None:
    response = httpx.get(running(auth_web).url, auth=("prom", "s3cret"))
    assert (response.status_code, response.text) == (200, "hello\n")


def test_a_password_that_passed_is_not_bcrypt_checked_again_and_failures_always_are(
    running: Any, auth_web: WebConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks: list[bytes] = []
    real = bcrypt.checkpw

    def counted(password: bytes, hashed: bytes) -> bool:
        checks.append(password)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counted)
    url = running(auth_web).url
    assert [httpx.get(url, auth=("prom", "s3cret")).status_code for _ in range(3)] == [200, 200, 200]
    assert [httpx.get(url, auth=("prom", "wrong")).status_code for _ in range(2)] == [401, 401]
    assert checks == [b"s3cret", b"wrong", b"wrong"]  # one check for the scraper; every failure pays


def test_htpasswd_2y_hashes_are_accepted(running: Any, tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode().replace("$2b$", "$2y$", 1)
    web = load_web_config(write(tmp_path, f"basic_auth_users:\n  prom: '{hashed}'\n"))
    assert httpx.get(running(web).url, auth=("prom", "pw")).status_code == 200


# --- TLS ---------------------------------------------------------------------------------------


@needs_openssl
def test_https_with_a_self_signed_cert_and_plain_http_is_refused(running: Any, tmp_path: Path) -> None:
    cert, _ = self_signed(tmp_path, "server", "IP:127.0.0.1")
    web = load_web_config(write(tmp_path, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"))
    server = running(web)
    assert server.url.startswith("https://127.0.0.1:")
    response = httpx.get(server.url, verify=ssl.create_default_context(cafile=cert))
    assert (response.status_code, response.text) == (200, "hello\n")
    with pytest.raises(httpx.HTTPError):
        httpx.get(server.url.replace("https://", "http://"), timeout=5)
    # The failed plain-HTTP connection did not stop the server.
    assert httpx.get(server.url, verify=ssl.create_default_context(cafile=cert)).status_code == 200


@needs_openssl
def test_client_ca_file_requires_a_client_cert_signed_by_the_ca(running: Any, tmp_path: Path) -> None:
    server_cert, _ = self_signed(tmp_path, "server", "IP:127.0.0.1")
    self_signed(tmp_path, "ca", None)
    client_key, client_csr, client_cert = (tmp_path / f"client.{ext}" for ext in ("key", "csr", "crt"))
    openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(client_key), "-out", str(client_csr), "-subj", "/CN=client",
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", str(client_csr), "-CA", str(tmp_path / "ca.crt"), "-CAkey", str(tmp_path / "ca.key"),
        "-CAcreateserial", "-out", str(client_cert), "-days", "1",
    )  # fmt: skip
    web = load_web_config(
        write(
            tmp_path,
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: ca.crt\n",
        )
    )
    url = running(web).url

    anonymous = ssl.create_default_context(cafile=server_cert)
    with pytest.raises(httpx.HTTPError):
        httpx.get(url, verify=anonymous, timeout=5)

    stranger = ssl.create_default_context(cafile=server_cert)
    stranger.load_cert_chain(server_cert, tmp_path / "server.key")  # a valid cert, not signed by the CA
    with pytest.raises(httpx.HTTPError):
        httpx.get(url, verify=stranger, timeout=5)

    client = ssl.create_default_context(cafile=server_cert)
    client.load_cert_chain(client_cert, client_key)
    response = httpx.get(url, verify=client, timeout=5)
    assert (response.status_code, response.text) == (200, "hello\n")


# --- bad files ---------------------------------------------------------------------------------


def error_of(path: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_web_config(path)
    return "\n".join(info.value.messages)


def test_unknown_key_names_file_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "basic_auth_user:\n  prom: x\n")
    message = error_of(path)
    assert f"web config {path}: basic_auth_user: unknown or unsupported key" in message


def test_unknown_tls_key_names_file_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "tls_server_config:\n  min_version: TLS13\n")
    message = error_of(path)
    assert f"web config {path}: tls_server_config.min_version: unknown or unsupported key" in message
    assert "tls_server_config.cert_file: required" in message


def test_missing_cert_file_names_file_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n")
    message = error_of(path)
    assert f"web config {path}: tls_server_config.cert_file: no such file: {tmp_path / 'nope.crt'}" in message
    assert "tls_server_config.key_file: no such file" in message


def test_file_that_is_not_a_certificate_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.crt").write_text("not a cert\n")
    (tmp_path / "a.key").write_text("not a key\n")
    path = write(tmp_path, "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n")
    assert f"web config {path}: tls_server_config.cert_file/key_file: cannot be loaded" in error_of(path)


def test_non_bcrypt_hash_names_file_and_user(tmp_path: Path) -> None:
    path = write(tmp_path, "basic_auth_users:\n  prom: plaintext-password\n")
    assert f"web config {path}: basic_auth_users.prom: not a bcrypt hash" in error_of(path)


def test_missing_empty_and_non_mapping_files_are_errors(tmp_path: Path) -> None:
    assert "cannot be read" in error_of(str(tmp_path / "absent.yml"))
    assert "is empty" in error_of(write(tmp_path, ""))
    assert "must be a mapping" in error_of(write(tmp_path, "- a\n"))


def test_unknown_client_auth_type_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: Nope\n")
    assert "tls_server_config.client_auth_type: 'Nope' is not one of" in error_of(path)


# --- wiring: the prometheus exporter, own telemetry, `wattpipe validate` ------------------------


def test_prometheus_exporter_serves_metrics_behind_basic_auth(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
    config = PrometheusConfig(
        listen="127.0.0.1:0", web_config_file=write(tmp_path, f"basic_auth_users:\n  prom: '{hashed}'\n")
    )
    exporter = PrometheusExporter(config, make_context("prometheus", "exporter"))
    exporter.start()
    try:
        assert httpx.get(exporter.url + "/metrics").status_code == 401
        assert httpx.get(exporter.url + "/metrics", auth=("prom", "s3cret")).status_code == 200
    finally:
        exporter.shutdown()


def test_prometheus_exporter_with_a_bad_web_config_is_not_built(tmp_path: Path) -> None:
    path = write(tmp_path, "basic_auth_users:\n  prom: plaintext\n")
    with pytest.raises(ConfigError, match=r"basic_auth_users\.prom: not a bcrypt hash"):
        PrometheusExporter(PrometheusConfig(web_config_file=path), make_context("prometheus", "exporter"))


def test_telemetry_serves_behind_basic_auth(auth_web: WebConfig) -> None:
    telemetry = Telemetry(SteppedClock())
    server = telemetry.serve("127.0.0.1:0", auth_web)
    try:
        assert httpx.get(server.url + "/healthz").status_code == 401
        assert httpx.get(server.url + "/healthz", auth=("prom", "s3cret")).status_code == 200
    finally:
        telemetry.close()


def test_validate_rejects_a_bad_telemetry_web_config_with_exit_2(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    config = yaml.safe_load((root / "configs" / "demo.yaml").read_text())
    web = write(tmp_path, "tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n")
    config.setdefault("service", {}).setdefault("telemetry", {})["web_config_file"] = web
    path = tmp_path / "wattpipe.yaml"
    path.write_text(yaml.safe_dump(config))
    out, err = io.StringIO(), io.StringIO()
    assert main(["validate", "-c", str(path)], out, err) == EXIT_CONFIG
    assert f"service.telemetry.web_config_file: web config {web}: tls_server_config.cert_file: no such file" in (
        err.getvalue()
    )
