"""The OpenTelemetry SDK's OTLP exporters, as the ``otlp`` exporter uses them: built from its config, with
their per-attempt log lines taken instead of logged (the exporter logs an outage once itself).

Two things that go wrong with the SDK's HTTP exporter (1.45) are put right here:

- it hands ``ca_file`` to a ``requests`` session as ``session.verify``, which ``requests`` lets the
  environment's ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` override (psf/requests#3829): where either is
  set (many container images set both) the exporter's own CA was ignored and every send failed
  verification. The session here keeps the CA it was given;
- when a connection fails (refused, TLS verification, no client certificate) its last log line is "Failed to
  export metrics batch due to timeout, max retries or shutdown", with the cause only in its retry lines (and
  none at all when ``timeout`` leaves no room for a retry). The session remembers the exception, and
  :func:`failure_detail` adds it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

from wattpipe.exporters._queued_sender import SendFailed

if TYPE_CHECKING:
    import requests

    from wattpipe.exporters._otlp_config import OtlpConfig

__all__ = ["SDK_LOGS", "Sender", "export_once", "failure_detail", "make_sender", "uses_tls"]

_SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.common.http",
)
"""Where the SDK's OTLP exporters log each failed attempt and each of their own retries."""


class Sender(Protocol):
    def export(self, metrics_data: MetricsData, timeout_millis: float = ...) -> MetricExportResult: ...

    def shutdown(self, timeout_millis: float = ...) -> None: ...


class _SdkLogs(logging.Filter):
    """Takes the SDK exporter's log lines made on a thread inside :meth:`capture`, instead of logging them.

    The SDK logs every failed attempt (and its own retries within ``timeout``) at WARNING or ERROR: during
    an outage that is a line every few seconds, per exporter. The sender logs the outage once itself, with
    the SDK's last line as the detail. Lines the SDK logs for anyone else's exports pass untouched.
    """

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    @contextlib.contextmanager
    def capture(self) -> Iterator[list[str]]:
        lines: list[str] = []
        self._local.lines = lines
        try:
            yield lines
        finally:
            self._local.lines = None

    def filter(self, record: logging.LogRecord) -> bool:
        lines: list[str] | None = getattr(self._local, "lines", None)
        if lines is None:
            return True
        lines.append(record.getMessage())
        return False

    def install(self) -> None:
        for name in _SDK_LOGGERS:
            logger = logging.getLogger(name)
            if self not in logger.filters:
                # First: the SDK's DuplicateFilter would otherwise drop the second exporter's identical line
                # (and keep its own state busy with lines that are not logged).
                logger.filters.insert(0, self)


SDK_LOGS = _SdkLogs()


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def uses_tls(config: OtlpConfig) -> bool:
    """Whether the exporter connects with TLS. gRPC: unless ``insecure`` (an ``https://`` endpoint is TLS
    even then: the SDK says so); HTTP: when the URL is ``https://`` (``insecure`` plays no part)."""
    scheme = urlparse(config.resolved_endpoint()).scheme.lower()
    if config.protocol == "grpc":
        return scheme == "https" or not config.insecure
    return scheme == "https"


def failure_detail(sender: Sender, lines: list[str]) -> str:
    """Why an export failed, from the SDK exporter's log lines taken during it (the last one says it), and,
    for HTTP, the error the connection failed with where that line does not name it."""
    detail = lines[-1].rstrip(".") if lines else "the SDK exporter failed"
    cause = sender.last_error if isinstance(sender, _HttpSender) else None
    if cause is not None and str(cause) not in detail:
        detail = f"{detail}: {type(cause).__name__}: {cause}"
    return detail


def export_once(sender: Sender, data: MetricsData, timeout_s: float) -> None:
    """One attempt at sending ``data``; :class:`SendFailed` with the SDK's own account of why, if it failed.

    The SDK reports a failure as a result and logs the cause: its lines are taken (not logged) and the last
    one becomes the failure's detail. Whatever else the SDK raises propagates as it is.
    """
    with SDK_LOGS.capture() as sdk_lines:
        result = sender.export(data, timeout_millis=timeout_s * 1000)
    if result is not MetricExportResult.SUCCESS:
        raise SendFailed(failure_detail(sender, sdk_lines))


def _root_cause(exc: BaseException) -> BaseException:
    """The innermost error behind ``exc`` (requests → urllib3 → ssl or socket)."""
    seen = {id(exc)}
    while True:
        reason = getattr(exc, "reason", None)  # urllib3's MaxRetryError keeps its cause here
        arg = exc.args[0] if exc.args else None
        inner = next(
            (e for e in (reason, exc.__cause__, arg) if isinstance(e, BaseException) and id(e) not in seen), None
        )
        if inner is None:
            return exc
        seen.add(id(exc := inner))


@functools.cache
def _session_class() -> type[requests.Session]:
    import requests

    class PinnedSession(requests.Session):
        """``verify`` as set on the session wins over ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE``; the last
        exception a request raised is kept (the SDK's transport turns it into a result and logs no cause)."""

        last_error: BaseException | None = None
        """What the last request raised (None: it got an answer, whatever its status)."""

        def merge_environment_settings(
            self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any
        ) -> dict[str, Any]:
            settings: dict[str, Any] = super().merge_environment_settings(url, proxies, stream, verify, cert)
            if verify is None and isinstance(self.verify, str):  # a CA file of our own: keep it
                settings["verify"] = self.verify
            return settings

        def request(self, *args: Any, **kwargs: Any) -> requests.Response:
            self.last_error = None
            try:
                return super().request(*args, **kwargs)
            except Exception as exc:
                self.last_error = exc
                raise

    return PinnedSession


class _HttpSender:
    """The SDK's HTTP exporter, with the session that keeps ``ca_file`` and remembers connection errors."""

    def __init__(self, config: OtlpConfig, endpoint: str, headers: Mapping[str, str]) -> None:
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

        # A PinnedSession: its class is made on first use, so that gRPC alone never imports requests.
        self._session: Any = _session_class()()
        self._exporter = HttpExporter(
            endpoint=endpoint,
            certificate_file=config.ca_file,
            client_key_file=config.key_file,
            client_certificate_file=config.cert_file,
            headers=dict(headers),
            timeout=config.timeout,
            compression=Compression.Gzip if config.compression == "gzip" else Compression.NoCompression,
            session=self._session,
        )
        self.last_error: BaseException | None = None
        """The error the last failed export's last request failed with (None when it got an answer)."""

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000) -> MetricExportResult:
        self._session.last_error = None  # an export that fails before any request (encoding) has no cause here
        result = self._exporter.export(metrics_data, timeout_millis=timeout_millis)
        error: BaseException | None = self._session.last_error
        failed = result is not MetricExportResult.SUCCESS
        self.last_error = _root_cause(error) if failed and error is not None else None
        return result

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        self._exporter.shutdown(timeout_millis=timeout_millis)


def make_sender(config: OtlpConfig) -> Sender:
    endpoint = config.resolved_endpoint()
    if config.protocol == "grpc":
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        credentials = None
        # TLS options apply whenever the channel is TLS: an https:// endpoint is TLS even with insecure: true.
        if uses_tls(config) and (config.ca_file or config.cert_file):
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(config.ca_file),
                private_key=_read(config.key_file),
                certificate_chain=_read(config.cert_file),
            )
        return GrpcExporter(
            endpoint=endpoint,
            insecure=config.insecure,
            credentials=credentials,
            headers={k.lower(): v for k, v in config.headers.items()},  # gRPC metadata keys are lowercase
            timeout=config.timeout,
            compression=grpc.Compression.Gzip if config.compression == "gzip" else grpc.Compression.NoCompression,
        )
    return _HttpSender(config, endpoint, config.headers)
