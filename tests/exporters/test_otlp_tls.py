"""Exporter ``otlp`` over TLS, against TLS-only test receivers on loopback (gRPC and HTTPS).

A CA, a server certificate it signs (SAN 127.0.0.1 and localhost), a client certificate it signs, and a second
CA with a server certificate of its own (the "wrong CA") are made once per module with the openssl binary;
without one the module is skipped. Every send that is meant to work has a generous ``timeout``; every one that
is meant to fail has a ``timeout`` under the SDK exporter's first internal backoff (0.8 s at least), so each
attempt is one connection and the SDK's last line is about that connection.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import subprocess
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.helpers.context import make_context
from tests.helpers.otlp_receiver import OtlpReceiver, ReceivedRequest, ServerTls, flatten, wait_until
from wattpipe.exporters.otlp import OtlpConfig, OtlpExporter
from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.clock import Timestamp
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import load_config_text
from wattpipe.pipeline.records import DevicePower, DeviceTotals
from wattpipe.pipeline.telemetry import Telemetry

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")

GPU = "GPU-tls-0"
START = Timestamp(monotonic_s=900.0, wall_s=1_767_225_500.0)
AT = Timestamp(monotonic_s=1000.0, wall_s=1_767_225_600.0)
RECORDS = 2  # per batch: the GPU's power and its totals
FAILED = "wattpipe_exporter_failed_total"
ENERGY_MJ = 1_234_567

SEND = {"timeout": 5.0, "retry_initial_interval": 0.05, "retry_max_interval": 0.2, "shutdown_timeout": 5.0}
"""For sends meant to work: room for a TLS handshake on a loaded machine."""
FAIL = {"timeout": 0.75, "retry_initial_interval": 0.02, "retry_max_interval": 0.05, "shutdown_timeout": 0.3}
"""For sends meant to fail: no SDK-internal retry (its first backoff is ≥ 0.8 s), quick retries of our own."""


# --- certificates ---------------------------------------------------------------------------------

_OPENSSL_CNF = """\
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
authorityKeyIdentifier = keyid
[localhost_server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
"""
_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class Pki:
    root: Path

    def crt(self, name: str) -> str:
        return str(self.root / f"{name}.crt")

    def key(self, name: str) -> str:
        return str(self.root / f"{name}.key")

    def client(self) -> dict[str, Any]:
        """The exporter options of a client that trusts the CA and presents its certificate (mutual TLS)."""
        return {"ca_file": self.crt("ca"), "cert_file": self.crt("client"), "key_file": self.key("client")}

    def server(self, name: str = "server", client_ca: str | None = None) -> ServerTls:
        return ServerTls(self.crt(name), self.key(name), self.crt(client_ca) if client_ca else None)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """ca → server (127.0.0.1, localhost), client (CN wattpipe-client) and localhost-server (localhost only);
    rogue-ca → rogue-server (127.0.0.1, localhost)."""
    root = tmp_path_factory.mktemp("pki")
    cnf = root / "openssl.cnf"
    cnf.write_text(_OPENSSL_CNF)
    for ca in ("ca", "rogue-ca"):
        _openssl("req", "-x509", *_EC, "-config", cnf, "-extensions", "ca", "-days", "2",
                 "-keyout", root / f"{ca}.key", "-out", root / f"{ca}.crt", "-subj", f"/CN=wattpipe test {ca}")  # fmt: skip
    leaves = [
        ("server", "server", "ca"),
        ("client", "client", "ca"),
        ("rogue-server", "server", "rogue-ca"),
        ("localhost-server", "localhost_server", "ca"),
    ]
    for serial, (name, extensions, ca) in enumerate(leaves, start=1):
        csr = root / f"{name}.csr"
        _openssl("req", "-new", *_EC, "-config", cnf, "-keyout", root / f"{name}.key", "-out", csr,
                 "-subj", f"/CN=wattpipe-{name}")  # fmt: skip
        _openssl("x509", "-req", "-in", csr, "-CA", root / f"{ca}.crt", "-CAkey", root / f"{ca}.key",
                 "-set_serial", str(serial), "-days", "2", "-extfile", cnf, "-extensions", extensions,
                 "-out", root / f"{name}.crt")  # fmt: skip
    return Pki(root)


@pytest.fixture
def receiver(pki: Pki) -> Iterator[OtlpReceiver]:
    """TLS only (gRPC and HTTPS), with the server certificate ca signed; no client certificate asked."""
    with OtlpReceiver(tls=pki.server()) as r:
        yield r


@pytest.fixture
def mtls_receiver(pki: Pki) -> Iterator[OtlpReceiver]:
    """TLS only, and a client certificate signed by ca required."""
    with OtlpReceiver(tls=pki.server(client_ca="ca")) as r:
        yield r


@pytest.fixture
def rogue_receiver(pki: Pki) -> Iterator[OtlpReceiver]:
    """TLS only, with a server certificate signed by rogue-ca (not the CA the exporter trusts)."""
    with OtlpReceiver(tls=pki.server("rogue-server")) as r:
        yield r


# --- helpers --------------------------------------------------------------------------------------


def batch() -> Batch:
    device: dict[str, Any] = {"device_id": GPU, "device_index": 0, "device_name": "NVIDIA H100", "vendor": "nvidia"}
    power = DevicePower(time=AT, **device, interval_s=5.0, power_w=250.5, idle_w=60.0, active_w=190.5,
                        energy_mj=1_252_500, idle_energy_mj=300_000, active_energy_mj=952_500)  # fmt: skip
    totals = DeviceTotals(time=AT, **device, energy_mj=ENERGY_MJ, idle_energy_mj=0, active_energy_mj=ENERGY_MJ,
                          attributed_energy_mj=0, unattributed_energy_mj=ENERGY_MJ, start=START)  # fmt: skip
    return Batch(time=AT, interval_s=5.0, node="n1").with_records([power, totals])


def make_exporter(endpoint: str, telemetry: Telemetry | None = None, **options: Any) -> OtlpExporter:
    config = OtlpConfig(endpoint=endpoint, **{**SEND, **options})
    return exporter_for(config, telemetry)


def exporter_for(config: OtlpConfig, telemetry: Telemetry | None = None) -> OtlpExporter:
    return OtlpExporter(config, make_context("otlp", "exporter", telemetry=telemetry, node_name="node-7"))


def counter(telemetry: Telemetry, name: str) -> float:
    value = telemetry.registry.get_sample_value(name, {"pipeline": "metrics", "component": "otlp"})
    return value or 0.0


def send_one(exporter: OtlpExporter) -> None:
    """Start, export one batch, shut down (which flushes it)."""

    async def go() -> None:
        exporter.start()
        await exporter.export(batch())
        await exporter.shutdown()

    asyncio.run(go())


def delivered(receiver: OtlpReceiver, exporter: OtlpExporter, protocol: str) -> ReceivedRequest:
    """Send one batch and return the one request it made, checked to carry the GPU's energy in joules."""
    send_one(exporter)
    (received,) = receiver.wait_for_requests(1, "grpc" if protocol == "grpc" else "http")
    energy = [p for p in flatten([received]) if p.name == "hw.energy"]
    assert [(p.value, p.start_ns, p.time_ns) for p in energy] == [(ENERGY_MJ / 1000, START.wall_ns, AT.wall_ns)]
    return received


@dataclass(frozen=True)
class Failure:
    attempts: int
    """Attempts the exporter made (and failed): the first, and one per debug line after it."""
    failed: float
    dropped: float
    warnings: list[str]
    """Every WARNING and above the exporter logged."""
    outage: list[str]
    """The "cannot send to" warnings among them."""
    shutdown_s: float
    """How long shutdown took."""
    sender_alive: bool
    """Whether the sender thread was still running after shutdown."""


_RETRY = re.compile(r"exporter otlp: attempt \d+ failed: ")


def send_failing(exporter: OtlpExporter, telemetry: Telemetry, caplog: pytest.LogCaptureFixture) -> Failure:
    """Export one batch to an endpoint it cannot send to: wait for three failed attempts, then shut down (which
    gives the batch up). A sender thread that died would make no more attempts, and the wait would time out."""
    caplog.set_level(logging.DEBUG)
    shutdown_s = 0.0
    sender_alive = True

    async def go() -> None:
        nonlocal shutdown_s, sender_alive
        exporter.start()
        assert exporter.sender.running
        await exporter.export(batch())
        what = "three failed attempts"
        await asyncio.to_thread(wait_until, lambda: counter(telemetry, FAILED) >= 3 * RECORDS, 10.0, what)
        began = time.monotonic()
        await exporter.shutdown()
        shutdown_s, sender_alive = time.monotonic() - began, not exporter.sender.wait_ended(0)

    asyncio.run(go())
    ours = [r for r in caplog.records if r.name.startswith("wattpipe.exporter.otlp")]
    warnings = [r.getMessage() for r in ours if r.levelno >= logging.WARNING]
    return Failure(
        attempts=1 + sum(1 for r in ours if r.levelno == logging.DEBUG and _RETRY.match(r.getMessage())),
        failed=counter(telemetry, FAILED),
        dropped=counter(telemetry, "wattpipe_exporter_dropped_total"),
        warnings=warnings,
        outage=[w for w in warnings if "cannot send to" in w],
        shutdown_s=shutdown_s,
        sender_alive=sender_alive,
    )


def check_failure(failure: Failure, exporter: OtlpExporter, receiver: OtlpReceiver) -> str:
    """What every failed TLS send shares: nothing received, every attempt counted, the outage logged once, the
    batch given up at shutdown (and counted), the exporter stopped cleanly and in time. Returns the outage's
    reason (what the warning says after "cannot send to ENDPOINT: ")."""
    assert receiver.requests() == []
    assert receiver.attempts() == 0  # no request got past the TLS handshake
    assert failure.attempts >= 3
    assert failure.failed == RECORDS * failure.attempts
    assert failure.dropped == RECORDS  # given up when shutdown_timeout passed
    assert exporter.queued == 0
    (outage,) = failure.outage  # one line for the whole outage, not one per attempt
    prefix = f"exporter otlp: cannot send to {exporter.config.resolved_endpoint()}: "
    assert outage.startswith(prefix)
    assert not failure.sender_alive
    # shutdown_timeout, then at most one attempt in flight (its timeout); slack for a loaded machine.
    assert failure.shutdown_s < exporter.config.shutdown_timeout + exporter.config.timeout + 1.5
    return outage[len(prefix) :].partition("; retrying with backoff")[0]


# --- 1. gRPC, server TLS with ca_file -------------------------------------------------------------


def test_grpc_with_ca_file_delivers_over_tls(receiver: OtlpReceiver, pki: Pki) -> None:
    telemetry = Telemetry(make_context().clock)
    received = delivered(receiver, make_exporter(receiver.grpc_endpoint, telemetry, ca_file=pki.crt("ca")), "grpc")
    assert received.tls
    assert received.client_cn == ""  # none asked, none sent
    assert counter(telemetry, FAILED) == 0
    assert counter(telemetry, "wattpipe_exporter_dropped_total") == 0


# --- 2. gRPC mutual TLS ---------------------------------------------------------------------------


def test_grpc_mutual_tls_delivers_with_a_client_certificate(mtls_receiver: OtlpReceiver, pki: Pki) -> None:
    exporter = make_exporter(mtls_receiver.grpc_endpoint, **pki.client())
    received = delivered(mtls_receiver, exporter, "grpc")
    assert received.tls
    assert received.client_cn == "wattpipe-client"


def test_grpc_mutual_tls_without_a_client_certificate_fails_counted_and_logged_once(
    mtls_receiver: OtlpReceiver, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(mtls_receiver.grpc_endpoint, telemetry, ca_file=pki.crt("ca"), **FAIL)
    reason = check_failure(send_failing(exporter, telemetry, caplog), exporter, mtls_receiver)
    # The server refuses the handshake; gRPC tells the client only that the connection closed.
    assert "StatusCode.UNAVAILABLE" in reason
    # Nothing crashed: the same receiver takes the same batch from an exporter with the client certificate.
    again = make_exporter(mtls_receiver.grpc_endpoint, **pki.client())
    assert delivered(mtls_receiver, again, "grpc").client_cn == "wattpipe-client"


# --- 3. gRPC, a server certificate the CA did not sign --------------------------------------------


def test_grpc_with_the_wrong_ca_fails_and_says_the_certificate_did_not_verify(
    rogue_receiver: OtlpReceiver, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(rogue_receiver.grpc_endpoint, telemetry, ca_file=pki.crt("ca"), **FAIL)
    reason = check_failure(send_failing(exporter, telemetry, caplog), exporter, rogue_receiver)
    # The SDK's words (gRPC's, from BoringSSL): the handshake failed because the certificate did not verify.
    assert "StatusCode.UNAVAILABLE" in reason
    assert "Tls handshake failed" in reason
    assert "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate" in reason


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_certificate_for_another_host_fails_hostname_verification(
    pki: Pki, caplog: pytest.LogCaptureFixture, protocol: str
) -> None:
    """Signed by the CA the exporter trusts, but for localhost only: 127.0.0.1 is not the name it was issued for."""
    telemetry = Telemetry(make_context().clock)
    with OtlpReceiver(tls=pki.server("localhost-server")) as other:
        grpc = protocol == "grpc"
        endpoint = other.grpc_endpoint if grpc else other.http_endpoint
        exporter = make_exporter(endpoint, telemetry, protocol=protocol, ca_file=pki.crt("ca"), **FAIL)
        reason = check_failure(send_failing(exporter, telemetry, caplog), exporter, other)
    if grpc:
        assert "Hostname Verification Check failed" in reason
    else:
        assert "CERTIFICATE_VERIFY_FAILED] certificate verify failed: IP address mismatch" in reason
        assert "certificate is not valid for '127.0.0.1'" in reason


# --- 4. HTTP over https ---------------------------------------------------------------------------


@pytest.mark.parametrize("ca_bundle_env", [None, "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"])
def test_http_with_ca_file_delivers_over_https_whatever_the_environment_says(
    receiver: OtlpReceiver, pki: Pki, monkeypatch: pytest.MonkeyPatch, ca_bundle_env: str | None
) -> None:
    """requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override a session's CA: before the fix, ca_file was
    ignored wherever either was set (most container images) and every send failed verification."""
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    if ca_bundle_env:
        monkeypatch.setenv(ca_bundle_env, pki.crt("rogue-ca"))  # a bundle that does not trust the receiver
    exporter = make_exporter(receiver.http_endpoint, protocol="http/protobuf", ca_file=pki.crt("ca"))
    received = delivered(receiver, exporter, "http/protobuf")
    assert received.tls
    assert received.path == "/v1/metrics"
    assert receiver.http_endpoint.startswith("https://")
    assert receiver.http_handshake_failures == 0


def test_http_mutual_tls_delivers_with_a_client_certificate(mtls_receiver: OtlpReceiver, pki: Pki) -> None:
    exporter = make_exporter(mtls_receiver.http_endpoint, protocol="http/protobuf", **pki.client())
    received = delivered(mtls_receiver, exporter, "http/protobuf")
    assert received.tls
    assert received.client_cn == "wattpipe-client"


def test_http_mutual_tls_without_a_client_certificate_fails_with_the_connection_error(
    mtls_receiver: OtlpReceiver, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(
        mtls_receiver.http_endpoint, telemetry, protocol="http/protobuf", ca_file=pki.crt("ca"), **FAIL
    )
    reason = check_failure(send_failing(exporter, telemetry, caplog), exporter, mtls_receiver)
    assert mtls_receiver.http_handshake_failures >= 3  # the receiver refused a handshake per attempt at least
    # The SDK's line names no cause; the connection's error follows it (which one depends on when the client
    # reads the server's refusal, TLS 1.3 finishing the client's handshake first: an EOF, the server's alert).
    sdk_line = "Failed to export metrics batch due to timeout, max retries or shutdown"
    assert re.fullmatch(rf"{sdk_line}: \w+Error: .+", reason), reason


def test_http_with_the_wrong_ca_fails_and_says_the_certificate_did_not_verify(
    rogue_receiver: OtlpReceiver, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(
        rogue_receiver.http_endpoint, telemetry, protocol="http/protobuf", ca_file=pki.crt("ca"), **FAIL
    )
    reason = check_failure(send_failing(exporter, telemetry, caplog), exporter, rogue_receiver)
    assert rogue_receiver.http_handshake_failures >= 3
    # Before the fix: the SDK's line alone ("Failed to export metrics batch due to timeout, max retries or
    # shutdown"), the cause being in retry lines that a short timeout never logs.
    assert reason.startswith(
        "Failed to export metrics batch due to timeout, max retries or shutdown: SSLCertVerificationError: "
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate"
    )


# --- 5. insecure ----------------------------------------------------------------------------------


def test_grpc_insecure_is_plaintext_and_fails_against_a_tls_server(
    receiver: OtlpReceiver, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(receiver.grpc_endpoint, telemetry, insecure=True, ca_file=pki.crt("ca"), **FAIL)
    failure = send_failing(exporter, telemetry, caplog)
    reason = check_failure(failure, exporter, receiver)
    assert "StatusCode.UNAVAILABLE" in reason
    # ca_file is not used, and the exporter says so once, when it starts.
    unused = [w for w in failure.warnings if "is not used" in w]
    assert unused == [
        f"exporter otlp: ca_file is not used: {receiver.grpc_endpoint} sends in plaintext (insecure: true)"
    ]


def test_grpc_insecure_still_sends_plaintext_to_a_plaintext_server() -> None:
    with OtlpReceiver() as plain:
        received = delivered(plain, make_exporter(plain.grpc_endpoint, insecure=True), "grpc")
    assert not received.tls


@pytest.mark.parametrize(
    ("scheme", "insecure"), [("", False), ("http://", False), ("https://", False), ("https://", True)]
)
def test_grpc_is_tls_with_ca_file_unless_insecure_whatever_the_scheme(
    receiver: OtlpReceiver, pki: Pki, caplog: pytest.LogCaptureFixture, scheme: str, insecure: bool
) -> None:
    """Only ``insecure: true`` makes gRPC plaintext (an http:// scheme does not), and an https:// endpoint is TLS
    even then (the SDK's rule). Before the fix the TLS options were dropped with insecure: true, so an https://
    endpoint verified against the default roots instead of ca_file and always failed."""
    caplog.set_level(logging.WARNING)
    exporter = make_exporter(f"{scheme}{receiver.grpc_endpoint}", insecure=insecure, ca_file=pki.crt("ca"))
    assert delivered(receiver, exporter, "grpc").tls
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.parametrize("with_ca_file", [True, False])
def test_http_insecure_changes_nothing_https_is_verified(
    receiver: OtlpReceiver, pki: Pki, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
    with_ca_file: bool,
) -> None:  # fmt: skip
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", pki.crt("rogue-ca"))  # the default trust store, made deterministic
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    telemetry = Telemetry(make_context().clock)
    options: dict[str, Any] = {"protocol": "http/protobuf", "insecure": True}
    if with_ca_file:
        assert delivered(receiver, make_exporter(receiver.http_endpoint, ca_file=pki.crt("ca"), **options), "http").tls
        return
    exporter = make_exporter(receiver.http_endpoint, telemetry, **options, **FAIL)
    reason = check_failure(send_failing(exporter, telemetry, caplog), exporter, receiver)
    assert "CERTIFICATE_VERIFY_FAILED" in reason  # insecure does not skip verification over HTTP


def test_http_url_is_plaintext_and_says_ca_file_is_not_used(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    with OtlpReceiver() as plain:
        exporter = make_exporter(plain.http_endpoint, protocol="http/protobuf", ca_file=pki.crt("ca"))
        assert not delivered(plain, exporter, "http/protobuf").tls
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        f"exporter otlp: ca_file is not used: {plain.http_endpoint}/v1/metrics sends in plaintext (an http:// URL)"
    ]


# --- files that are not there ------------------------------------------------------------------


@pytest.mark.parametrize("option", ["ca_file", "cert_file", "key_file"])
def test_a_tls_file_that_is_not_there_is_a_config_error_naming_it(pki: Pki, option: str) -> None:
    files = {"ca_file": pki.crt("ca"), "cert_file": pki.crt("client"), "key_file": pki.key("client")}
    files[option] = str(pki.root / "missing.pem")
    with pytest.raises(ValidationError, match=rf"{option} .*missing\.pem: no such file"):
        OtlpConfig(endpoint="localhost:4317", **files)


def test_grpc_reads_the_tls_files_at_start_and_a_missing_one_fails_it(receiver: OtlpReceiver, pki: Pki) -> None:
    missing = pki.root / "gone.crt"
    missing.write_bytes(Path(pki.crt("ca")).read_bytes())
    exporter = make_exporter(receiver.grpc_endpoint, ca_file=str(missing))
    missing.unlink()  # removed after the configuration was checked
    with pytest.raises(FileNotFoundError, match=r"gone\.crt"):
        exporter.start()
    assert receiver.attempts() == 0


def test_http_reads_the_tls_files_per_connection_and_a_missing_one_fails_every_send(
    receiver: OtlpReceiver, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    gone = pki.root / "gone-http.crt"
    gone.write_bytes(Path(pki.crt("ca")).read_bytes())
    missing = str(gone)
    telemetry = Telemetry(make_context().clock)
    exporter = make_exporter(receiver.http_endpoint, telemetry, protocol="http/protobuf", ca_file=missing, **FAIL)
    gone.unlink()  # removed after the configuration was checked
    reason = check_failure(send_failing(exporter, telemetry, caplog), exporter, receiver)
    assert receiver.http_handshake_failures == 0  # it never connects
    # requests' words, once: the SDK's line already names the cause.
    assert reason == (
        "Failed to export metrics batch code: None, reason: "
        f"Could not find a suitable TLS CA certificate bundle, invalid path: {missing}"
    )


# --- 6. headers from the environment, over TLS ----------------------------------------------------

CONFIG = """\
receivers:
  custom/gpu: {class: "tests.helpers.components:CountingGpu"}
exporters:
  otlp:
    endpoint: "${env:OTLP_ENDPOINT}"
    protocol: PROTOCOL
    ca_file: "${env:OTLP_CA}"
    timeout: 5
    headers:
      authorization: "Bearer ${env:OTLP_TOKEN}"
      X-Tenant: "${env:OTLP_TENANT:-energy}"
service:
  node_name: node-7
  pipelines:
    metrics: {interval: 5s, receivers: [custom/gpu], exporters: [otlp]}
"""


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_headers_from_the_environment_reach_the_server_over_tls(
    receiver: OtlpReceiver, pki: Pki, protocol: str
) -> None:
    grpc = protocol == "grpc"
    environ = {
        "OTLP_ENDPOINT": receiver.grpc_endpoint if grpc else receiver.http_endpoint,
        "OTLP_CA": pki.crt("ca"),
        "OTLP_TOKEN": "s3cret-t0ken",
    }
    registry = Registry.from_entry_points()
    config = load_config_text(textwrap.dedent(CONFIG.replace("PROTOCOL", protocol)), "tls.yaml", registry, environ)
    otlp = config.exporters["otlp"]
    assert isinstance(otlp, OtlpConfig)
    assert otlp.headers == {"authorization": "Bearer s3cret-t0ken", "X-Tenant": "energy"}
    received = delivered(receiver, exporter_for(otlp), protocol)
    assert received.tls
    headers = {name.lower(): value for name, value in received.metadata.items()}
    assert headers["authorization"] == "Bearer s3cret-t0ken"
    assert headers["x-tenant"] == "energy"
    if grpc:  # gRPC metadata keys are lower case on the wire
        assert "x-tenant" in received.metadata
