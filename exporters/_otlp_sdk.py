"""The OpenTelemetry SDK's OTLP exporters, as the ``otlp`` exporter uses them: built from its config, with
their per-attempt log lines taken instead of logged (the exporter logs an outage once itself)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

if TYPE_CHECKING:
    from exporters.otlp import OtlpConfig

__all__ = ["SDK_LOGS", "Sender", "make_sender"]

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


def make_sender(config: OtlpConfig) -> Sender:
    endpoint = config.resolved_endpoint()
    if config.protocol == "grpc":
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        credentials = None
        if not config.insecure and (config.ca_file or config.cert_file):
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
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    return HttpExporter(
        endpoint=endpoint,
        certificate_file=config.ca_file,
        client_key_file=config.key_file,
        client_certificate_file=config.cert_file,
        headers=config.headers,
        timeout=config.timeout,
        compression=Compression.Gzip if config.compression == "gzip" else Compression.NoCompression,
    )
