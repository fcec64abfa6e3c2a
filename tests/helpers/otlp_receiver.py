"""A small OTLP metrics receiver for tests: gRPC and HTTP/protobuf ``/v1/metrics`` on loopback.

Built on opentelemetry-proto's generated classes, on ephemeral ports, with no collector binary. It records
every request it accepts (with its gRPC metadata, or its HTTP path and headers), counts every attempt, and
can be switched at any time:

- ``down = True``: every request is refused as in a collector outage (gRPC ``UNAVAILABLE``, HTTP 503) and
  counted as refused;
- ``delay_s = N``: every request is held N real seconds before it is answered (a slow collector). Lowering
  it releases the requests being held, and stopping the receiver answers them, so a test never waits out
  a long delay.

With ``tls=ServerTls(cert_file, key_file)`` both endpoints serve TLS only (``grpc.ssl_server_credentials``;
an ``ssl.SSLContext`` around each HTTP connection, so :attr:`OtlpReceiver.http_endpoint` is ``https://``);
``client_ca_file`` also requires a client certificate signed by that CA. Each accepted request records
whether it came over TLS and its client certificate's common name.

Several exporters can share one receiver: give each a ``headers: {x-otlp-sender: NAME}`` and select with
``sender=NAME``. :func:`flatten` turns requests into :class:`ReceivedPoint` rows (name, unit, attributes,
start and time, value, temporality, resource attributes), which is what tests compare. Waiting is always
on a condition with a timeout (:meth:`OtlpReceiver.wait_for_requests`, :func:`wait_until`).

    with OtlpReceiver() as receiver:
        ... an otlp exporter with endpoint=receiver.grpc_endpoint (or receiver.http_endpoint) ...
        receiver.wait_for_requests(1, protocol="grpc")
        points = receiver.points(protocol="grpc")
"""

from __future__ import annotations

import collections
import functools
import gzip
import http.server
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

__all__ = [
    "CUMULATIVE",
    "DELTA",
    "SENDER_HEADER",
    "OtlpReceiver",
    "Protocol",
    "ReceivedPoint",
    "ReceivedRequest",
    "ServerTls",
    "attributes",
    "flatten",
    "wait_until",
]

Request = metrics_service_pb2.ExportMetricsServiceRequest
Protocol = Literal["grpc", "http"]
CUMULATIVE = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
AttributeValue = str | int | float | bool | bytes | None


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0, what: str = "a condition") -> None:
    """Poll ``condition`` until it holds; fail after ``timeout_s`` real seconds (a bound, never a sleep)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.005)


# --- what was received ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReceivedRequest:
    protocol: Protocol
    request: Any
    """The decoded ``ExportMetricsServiceRequest``."""
    metadata: Mapping[str, str]
    """gRPC invocation metadata, or the HTTP request's headers."""
    path: str = ""
    """HTTP only: the request's path."""
    received_s: float = 0.0
    """``time.monotonic()`` when it was accepted."""
    tls: bool = False
    """Whether it came over TLS."""
    client_cn: str = ""
    """The common name of the client certificate it came with ("" without one)."""

    @property
    def sender(self) -> str:
        """The :data:`SENDER_HEADER` it carried ("" without one)."""
        return _sender_of(self.metadata)


@dataclass(frozen=True)
class ReceivedPoint:
    """One data point of a received request, with what it needs to be compared on its own."""

    name: str
    unit: str
    kind: Literal["gauge", "sum"]
    attributes: Mapping[str, AttributeValue]
    start_ns: int
    time_ns: int
    value: float
    temporality: int
    """``AGGREGATION_TEMPORALITY_*`` for sums; 0 (unspecified) for gauges."""
    monotonic: bool
    resource: Mapping[str, AttributeValue]
    scope: str
    request_index: int = 0
    """Which request (in the order given to :func:`flatten`) it came in."""

    def series(self) -> tuple[str, frozenset[tuple[str, AttributeValue]]]:
        """The series it belongs to: its metric and attribute set (the resource is one per exporter)."""
        return self.name, frozenset(self.attributes.items())


def _any_value(value: common_pb2.AnyValue) -> AttributeValue:
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which in ("array_value", "kvlist_value"):
        return str(getattr(value, which))  # not used by wattpipe; kept comparable
    result: AttributeValue = getattr(value, which)
    return result


def attributes(pairs: Iterable[common_pb2.KeyValue]) -> dict[str, AttributeValue]:
    """OTLP ``KeyValue`` attributes as a plain dict (ints stay ints, strings strings)."""
    return {kv.key: _any_value(kv.value) for kv in pairs}


def flatten(requests: Iterable[Any]) -> list[ReceivedPoint]:
    """Every number data point of ``requests`` (``ExportMetricsServiceRequest`` or :class:`ReceivedRequest`)."""
    out: list[ReceivedPoint] = []
    for index, item in enumerate(requests):
        request = item.request if isinstance(item, ReceivedRequest) else item
        for rm in request.resource_metrics:
            resource = attributes(rm.resource.attributes)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    which = metric.WhichOneof("data")
                    if which == "gauge":
                        data_points, temporality, monotonic = metric.gauge.data_points, 0, False
                    elif which == "sum":
                        data_points = metric.sum.data_points
                        temporality, monotonic = metric.sum.aggregation_temporality, metric.sum.is_monotonic
                    else:
                        raise AssertionError(f"{metric.name}: unexpected OTLP data {which!r}")
                    for p in data_points:
                        value = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
                        out.append(
                            ReceivedPoint(
                                name=metric.name,
                                unit=metric.unit,
                                kind=which,
                                attributes=attributes(p.attributes),
                                start_ns=p.start_time_unix_nano,
                                time_ns=p.time_unix_nano,
                                value=value,
                                temporality=temporality,
                                monotonic=monotonic,
                                resource=resource,
                                scope=sm.scope.name,
                                request_index=index,
                            )
                        )
    return out


# --- the receiver ---------------------------------------------------------------------------------

SENDER_HEADER = "x-otlp-sender"
"""A request header (gRPC metadata) tests may set per exporter (``headers: {x-otlp-sender: NAME}``) to tell
apart several exporters sending to one receiver; :meth:`OtlpReceiver.requests` filters on it."""


def _sender_of(metadata: Mapping[str, str]) -> str:
    return next((value for key, value in metadata.items() if key.lower() == SENDER_HEADER), "")


class _Servicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        metadata = {key: value for key, value in context.invocation_metadata() if isinstance(value, str)}
        auth = context.auth_context()
        tls = auth.get("transport_security_type") == [b"ssl"]
        client_cn = b"".join(auth.get("x509_common_name", [])[:1]).decode()
        if not self._receiver._accept("grpc", request, metadata, "", tls, client_cn):
            context.abort(grpc.StatusCode.UNAVAILABLE, "collector down (test receiver)")
        return metrics_service_pb2.ExportMetricsServiceResponse()


class _HttpHandler(http.server.BaseHTTPRequestHandler):
    receiver: OtlpReceiver
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        encoding = (self.headers.get("Content-Encoding") or "").lower()
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        if self.path != "/v1/metrics":
            self._reply(404, b"not found: OTLP metrics are posted to /v1/metrics", "text/plain")
            return
        request = Request()
        request.ParseFromString(body)
        tls, client_cn = isinstance(self.connection, ssl.SSLSocket), ""
        if tls:
            subject = (self.connection.getpeercert() or {}).get("subject", ())
            client_cn = next((value for rdn in subject for key, value in rdn if key == "commonName"), "")
        if not self.receiver._accept("http", request, dict(self.headers.items()), self.path, tls, client_cn):
            self._reply(503, b"collector down (test receiver)", "text/plain")
            return
        self._reply(200, metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString())

    def _reply(self, code: int, body: bytes, content_type: str = "application/x-protobuf") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass(frozen=True)
class ServerTls:
    """The receiver's TLS: its certificate and key (PEM files) and, to require client certificates, their CA."""

    cert_file: str | Path
    key_file: str | Path
    client_ca_file: str | Path | None = None
    """Clients must present a certificate signed by this CA (mutual TLS); None: no client certificate asked."""

    def grpc_credentials(self) -> grpc.ServerCredentials:
        pair = (Path(self.key_file).read_bytes(), Path(self.cert_file).read_bytes())
        client_ca = Path(self.client_ca_file).read_bytes() if self.client_ca_file else None
        return grpc.ssl_server_credentials(
            [pair], root_certificates=client_ca, require_client_auth=client_ca is not None
        )

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            context.load_verify_locations(cafile=str(self.client_ca_file))
            context.verify_mode = ssl.CERT_REQUIRED
        return context


class _TlsHttpServer(http.server.ThreadingHTTPServer):
    """HTTPS: each accepted connection is wrapped in TLS, and its handshake made on the connection's own thread
    (a client that fails it, or stalls, never holds up the accept loop). Failed handshakes are counted."""

    def __init__(self, address: tuple[str, int], handler: type[http.server.BaseHTTPRequestHandler], tls: ServerTls):
        super().__init__(address, handler)
        self.context = tls.ssl_context()
        self.handshake_failures = 0
        self.handshake_errors: list[str] = []
        self._failures_lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def finish_request(self, request: Any, client_address: Any) -> None:
        assert isinstance(request, ssl.SSLSocket)
        request.settimeout(10.0)
        try:
            request.do_handshake()
        except (OSError, ValueError) as exc:
            with self._failures_lock:
                self.handshake_failures += 1
                self.handshake_errors.append(f"{type(exc).__name__}: {exc}")
            return
        request.settimeout(None)
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away (or broke TLS) mid-request: nothing for a test receiver to report


class OtlpReceiver:
    """gRPC and HTTP/protobuf OTLP metrics endpoints on 127.0.0.1 ephemeral ports, started by :meth:`start`
    (or by entering it as a context manager) and stopped by :meth:`stop`.

    ``down`` and ``delay_s`` may be changed at any time from any thread; lowering ``delay_s`` also shortens
    the wait of requests already being held (``delay_s = 0`` answers them at once).
    """

    def __init__(self, *, grpc_workers: int = 8, tls: ServerTls | None = None) -> None:
        self.down = False
        """Refuse every request (gRPC UNAVAILABLE, HTTP 503): a collector outage."""
        self._delay_s = 0.0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._requests: list[ReceivedRequest] = []
        self._attempts: collections.Counter[tuple[Protocol, str]] = collections.Counter()
        self._refused: collections.Counter[tuple[Protocol, str]] = collections.Counter()
        self._in_flight = 0
        self._max_in_flight = 0
        self._stopped = False
        self._grpc_workers = grpc_workers
        self._tls = tls
        self._grpc: Any = None
        self._http: http.server.ThreadingHTTPServer | None = None
        self._grpc_port = 0
        self._http_port = 0

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> OtlpReceiver:
        server = grpc.server(ThreadPoolExecutor(max_workers=self._grpc_workers, thread_name_prefix="otlp-receiver"))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Servicer(self), server)
        if self._tls is None:
            self._grpc_port = server.add_insecure_port("127.0.0.1:0")
        else:
            self._grpc_port = server.add_secure_port("127.0.0.1:0", self._tls.grpc_credentials())
        server.start()
        self._grpc = server
        handler = type("Handler", (_HttpHandler,), {"receiver": self})
        if self._tls is None:
            self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        else:
            self._http = _TlsHttpServer(("127.0.0.1", 0), handler, self._tls)
        self._http.daemon_threads = True
        self._http_port = int(self._http.server_address[1])
        # A short poll interval: stop() waits for the serving loop to look (0.5 s by default, per test).
        serve = functools.partial(self._http.serve_forever, poll_interval=0.02)
        threading.Thread(target=serve, name="otlp-receiver-http", daemon=True).start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopped = True  # requests being held are answered now
            self._changed.notify_all()
        if self._grpc is not None:
            self._grpc.stop(grace=None).wait(5)
            self._grpc = None
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def grpc_endpoint(self) -> str:
        """``host:port`` for the otlp exporter's ``endpoint`` with ``protocol: grpc``."""
        return f"127.0.0.1:{self._grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """The base URL for ``protocol: http/protobuf`` (the exporter appends ``/v1/metrics``): ``https://``
        when the receiver serves TLS."""
        scheme = "http" if self._tls is None else "https"
        return f"{scheme}://127.0.0.1:{self._http_port}"

    @property
    def http_handshake_failures(self) -> int:
        """HTTPS connections whose TLS handshake failed (a client that does not trust the receiver's
        certificate, or has no client certificate where one is required). Always 0 without TLS."""
        server = self._http
        return server.handshake_failures if isinstance(server, _TlsHttpServer) else 0

    @property
    def delay_s(self) -> float:
        """Real seconds each request is held before it is answered: a slow collector."""
        return self._delay_s

    @delay_s.setter
    def delay_s(self, value: float) -> None:
        with self._lock:
            self._delay_s = value
            self._changed.notify_all()

    # --- the receiving side ----------------------------------------------------------------------

    def _accept(
        self,
        protocol: Protocol,
        request: Any,
        metadata: dict[str, str],
        path: str,
        tls: bool = False,
        client_cn: str = "",
    ) -> bool:
        key = (protocol, _sender_of(metadata))
        arrived = time.monotonic()
        with self._lock:
            self._attempts[key] += 1
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            self._changed.notify_all()
            try:
                # Held while slow: the wait re-reads delay_s, so lowering it releases the request early.
                while not self._stopped and (left := arrived + self._delay_s - time.monotonic()) > 0:
                    self._changed.wait(left)
                accepted = not self.down
                if accepted:
                    self._requests.append(
                        ReceivedRequest(protocol, request, metadata, path, time.monotonic(), tls, client_cn)
                    )
                else:
                    self._refused[key] += 1
                return accepted
            finally:
                self._in_flight -= 1
                self._changed.notify_all()

    # --- what tests ask --------------------------------------------------------------------------

    def _select(self, protocol: Protocol | None, sender: str | None) -> list[ReceivedRequest]:
        return [
            r
            for r in self._requests
            if (protocol is None or r.protocol == protocol) and (sender is None or r.sender == sender)
        ]

    @staticmethod
    def _total(counts: collections.Counter[tuple[Protocol, str]], protocol: Protocol | None, sender: str | None) -> int:
        return sum(n for (p, s), n in counts.items() if protocol in (None, p) and sender in (None, s))

    def requests(self, protocol: Protocol | None = None, sender: str | None = None) -> list[ReceivedRequest]:
        """Accepted requests in the order they arrived: all, or of one protocol and/or sender."""
        with self._lock:
            return self._select(protocol, sender)

    def count(self, protocol: Protocol | None = None, sender: str | None = None) -> int:
        return len(self.requests(protocol, sender))

    def attempts(self, protocol: Protocol | None = None, sender: str | None = None) -> int:
        """Requests that reached the receiver, accepted or refused."""
        with self._lock:
            return self._total(self._attempts, protocol, sender)

    def refused(self, protocol: Protocol | None = None, sender: str | None = None) -> int:
        """Requests refused while ``down``."""
        with self._lock:
            return self._total(self._refused, protocol, sender)

    @property
    def in_flight(self) -> int:
        """Requests being answered right now (held ones included)."""
        with self._lock:
            return self._in_flight

    def points(self, protocol: Protocol | None = None, sender: str | None = None) -> list[ReceivedPoint]:
        """Every data point accepted so far (all, or of one protocol and/or sender), request by request."""
        return flatten(self.requests(protocol, sender))

    def wait_for_requests(
        self, count: int, protocol: Protocol | None = None, sender: str | None = None, timeout_s: float = 10.0
    ) -> list[ReceivedRequest]:
        """Wait until at least ``count`` requests were accepted; return them all, in order."""
        self._wait(lambda: len(self._select(protocol, sender)) >= count, timeout_s, f"{count} accepted requests")
        return self.requests(protocol, sender)

    def wait_for_attempts(
        self, count: int, protocol: Protocol | None = None, sender: str | None = None, timeout_s: float = 10.0
    ) -> int:
        """Wait until at least ``count`` requests reached the receiver (accepted or refused); return how many."""
        self._wait(lambda: self._total(self._attempts, protocol, sender) >= count, timeout_s, f"{count} attempts")
        return self.attempts(protocol, sender)

    def _wait(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not condition():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"timed out after {timeout_s:g} s waiting for {what}: {len(self._requests)} accepted, "
                        f"attempts {dict(self._attempts)}, refused {dict(self._refused)}"
                    )
                self._changed.wait(remaining)
