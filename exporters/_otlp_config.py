"""The ``otlp`` exporter's options, apart from the exporter: both the exporter (exporters/otlp.py) and the
SDK glue that builds its sender (exporters/_otlp_sdk.py) read them, and neither may import the other."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, model_validator

from wattpipe.pipeline.components import ComponentConfig

__all__ = ["OtlpConfig"]


class OtlpConfig(ComponentConfig):
    endpoint: str | None = None
    """Where to send: ``host:port`` for gRPC (default ``localhost:4317``), a URL for HTTP (default
    ``http://localhost:4318/v1/metrics``; a URL without a path gets ``/v1/metrics``)."""
    protocol: Literal["grpc", "http/protobuf"] = "grpc"
    headers: dict[str, str] = Field(default_factory=dict)
    """Sent with every request (``${env:…}`` in the config file keeps secrets out of it)."""
    insecure: bool = False
    """gRPC only: plaintext instead of TLS, the TLS files unused (an ``https://`` endpoint is TLS all the same).
    For HTTP the URL's scheme decides and ``insecure`` does nothing."""
    ca_file: str | None = None
    """PEM CA(s) to verify the endpoint's certificate with, instead of the default trust store."""
    cert_file: str | None = None
    """PEM client certificate, for endpoints that require one (with ``key_file``)."""
    key_file: str | None = None
    compression: Literal["none", "gzip"] = "none"
    timeout: float = Field(default=10.0, gt=0)
    """Seconds per send attempt (the SDK exporter may retry transient errors inside it)."""
    temporality: Literal["cumulative", "delta"] = "cumulative"
    service_instance_id: str | None = None
    """``service.instance.id``; the node name by default, so series stay one across restarts."""
    queue_size: int = Field(default=100, ge=1)
    """Batches waiting for the sender; when full the oldest is dropped (and counted)."""
    retry_initial_interval: float = Field(default=5.0, gt=0)
    retry_max_interval: float = Field(default=30.0, gt=0)
    retry_max_elapsed_time: float = Field(default=300.0, gt=0)
    """Seconds after a batch's first failed attempt at which it is given up (and counted as dropped)."""
    shutdown_timeout: float = Field(default=5.0, gt=0)
    """Seconds ``shutdown`` spends sending what is queued before dropping the rest."""

    @model_validator(mode="after")
    def _check(self) -> OtlpConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (a client certificate needs its key)")
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            # Named now (`wattpipe validate` says so), not as a failed send an hour later.
            if path is not None and not os.access(path, os.R_OK):
                why = "no such file" if not os.path.exists(path) else "not readable by this user"
                raise ValueError(f"{name} {path}: {why}")
        if self.retry_max_interval < self.retry_initial_interval:
            raise ValueError("retry_max_interval must be at least retry_initial_interval")
        return self

    def resolved_endpoint(self) -> str:
        if self.protocol == "grpc":
            return self.endpoint or "localhost:4317"
        url = (self.endpoint or "http://localhost:4318").rstrip("/")
        head, sep, path = url.partition("://")
        return url if sep and "/" in path else f"{head}{sep}{path}/v1/metrics"
