"""Receiver ``dcgm``: per-MIG-instance activity and every per-GPU field, scraped from dcgm-exporter.

NVML cannot say how busy a MIG instance is; DCGM can (``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` per GPU
instance), and dcgm-exporter, which the GPU Operator runs on every GPU node, prints it. This receiver
scrapes the exporter's ``/metrics`` once a tick (httpx, streamed, bounded in time and bytes), parses it
with prometheus_client's parser, and produces:
- a :class:`~pipeline.records.MigActivity` per GPU instance (parent UUID, ``GPU_I_ID``, profile):
  ``GR_ENGINE_ACTIVE``, and ``SM_ACTIVE`` where the exporter is configured to print it;
- a :class:`~pipeline.records.DeviceSignals` per GPU: every field seen, in SI units, board fields
  taken once per GPU, never summed over its instances (see ``_parse`` and docs/dcgm.md).

The exporter samples every 30 s by default, so consecutive scrapes can return the same values: records
carry the time of the scrape, the values describe the exporter's last sampling window. The scrape that
first sees a GPU's values change marks its MigActivity records with when that collection happened (after
the previous answered scrape, by this one) and the window it covers (``collect_interval``), so that MIG
attribution can split each stretch of energy by the activity measured over that same stretch.

Failure modes, none of which stops the pipeline:
- exporter unreachable, slow, answering garbage or an oversized body: :class:`DcgmScrapeError` names
  the endpoint and what happened; the runtime counts it (``wattpipe_receiver_errors_total``) and logs
  it rate-limited, and the tick goes on without this receiver;
- no ``endpoint`` configured: discovered (the exporter pod on this node, else ``localhost:9400``) and
  discovered again after ``rediscover_after`` failed scrapes in a row, in the background;
- rows the receiver cannot place (no UUID, a non-numeric ``GPU_I_ID``): skipped, with a rate-limited
  warning.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Self

import httpx
from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.config import Duration
from wattpipe.pipeline.records import Record
from wattpipe.pipeline.telemetry import ComponentTelemetry
from wattpipe.receivers.dcgm._collections import Collection, CollectionTracker
from wattpipe.receivers.dcgm._discovery import Discovery, discover
from wattpipe.receivers.dcgm._fields import FIELDS, Signal, instance_scoped, signal_for
from wattpipe.receivers.dcgm._parse import ParseError, Scrape, Series, parse_exposition, to_records
from wattpipe.receivers.dcgm._scrape import DcgmScrapeError, ScrapeReason, TlsOptions, fetch, redact, ssl_context

__all__ = [
    "FIELDS",
    "Collection",
    "CollectionTracker",
    "DcgmConfig",
    "DcgmReceiver",
    "DcgmScrapeError",
    "Discovery",
    "ParseError",
    "Scrape",
    "ScrapeReason",
    "Series",
    "Signal",
    "discover",
    "factory",
    "instance_scoped",
    "parse_exposition",
    "signal_for",
    "to_records",
]

_PROVIDES = frozenset({"mig_activity", "device_signals"})


class DcgmConfig(ComponentConfig):
    endpoint: str = ""
    """dcgm-exporter's metrics URL (``http://host:9400/metrics``); empty: discover it (docs/dcgm.md)."""
    timeout: Duration = 2.0
    """The most one scrape may take, start to last byte. Keep it under the pipeline's receiver timeout."""
    max_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    """Refuse (and count) an answer larger than this, without reading the rest."""
    ca_file: str = ""
    """PEM bundle to verify an https exporter with; empty: the system's trust store."""
    cert_file: str = ""
    """Client certificate (PEM) for exporters that require one; ``key_file`` if the key is separate."""
    key_file: str = ""
    insecure_skip_verify: bool = False
    """Do not verify the exporter's certificate (a self-signed exporter, on a trusted network only)."""
    bearer_token: SecretStr | None = None
    """Sent as ``Authorization: Bearer …`` (for a kube-rbac-proxy in front of the exporter). Never logged."""
    bearer_token_file: str = ""
    """Read the token from this file at every scrape, so a rotated service-account token is picked up."""
    discovery_label_selector: str = "app=nvidia-dcgm-exporter"
    """How discovery recognises the exporter pod on this node (the GPU Operator's label by default)."""
    discovery_port: int = Field(default=9400, ge=1, le=65535)
    rediscover_after: int = Field(default=3, ge=1)
    """Look the endpoint up again after this many failed scrapes in a row (discovered endpoints only)."""
    collect_interval: Duration = 30.0
    """dcgm-exporter's collection interval (its ``-c``, 30 s by default): each activity value is the mean
    over this long before its collection. MIG attribution settles each tick by the window covering it."""

    @field_validator("timeout", "collect_interval")
    @classmethod
    def _positive(cls, value: float, info: ValidationInfo) -> float:
        if value <= 0:
            raise ValueError(f"{info.field_name} must be longer than 0s")
        return value

    @field_validator("endpoint")
    @classmethod
    def _url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must be an http:// or https:// URL, got {value!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.bearer_token is not None and self.bearer_token.get_secret_value() and self.bearer_token_file:
            raise ValueError("set bearer_token or bearer_token_file, not both")
        if self.key_file and not self.cert_file:
            raise ValueError("key_file needs cert_file")
        if self.insecure_skip_verify and self.ca_file:
            raise ValueError("insecure_skip_verify ignores ca_file: set one of them")
        return self

    @property
    def tls(self) -> TlsOptions:
        return TlsOptions(self.ca_file, self.cert_file, self.key_file, self.insecure_skip_verify)


class DcgmReceiver:
    provides = _PROVIDES

    def __init__(
        self,
        config: DcgmConfig,
        ctx: CreateContext,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``transport`` replaces the network (tests: ``httpx.MockTransport``); ``env`` the process's
        environment for discovery (``NODE_NAME``, ``KUBECONFIG``)."""
        self.config = config
        self.component_id = ctx.component_id
        self.clock = ctx.clock
        self.log = ctx.logger
        self.rl: ComponentTelemetry = ctx.telemetry
        self._transport = transport
        self._env = env if env is not None else os.environ
        self._client: httpx.AsyncClient | None = None
        self.endpoint: str | None = config.endpoint or None
        self.failures = 0  # failed scrapes in a row
        self._executor: ThreadPoolExecutor | None = None  # discovery's thread, made when first needed
        self._discovery: Future[Discovery] | None = None
        self._collections = CollectionTracker()

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self._ensure_client()
        if self.endpoint is None:
            self._apply(await asyncio.wrap_future(self._discover()))

    async def shutdown(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _ensure_client(self) -> httpx.AsyncClient:
        if self._client is None:
            tls = self.config.tls
            self._client = httpx.AsyncClient(
                transport=self._transport,
                verify=ssl_context(tls) if tls.configured else True,
                timeout=httpx.Timeout(self.config.timeout),
                follow_redirects=False,
                trust_env=False,  # no proxy from the environment: the exporter is on this node
            )
        return self._client

    # --- the tick -------------------------------------------------------------------------

    async def collect(self) -> Sequence[Record]:
        now = self.clock.now()
        client = self._ensure_client()
        endpoint = await self._endpoint()
        try:
            body = await fetch(
                client,
                endpoint,
                headers=self._headers(endpoint),
                timeout_s=self.config.timeout,
                max_bytes=self.config.max_bytes,
            )
            scrape = await asyncio.to_thread(self._parse, endpoint, body)
        except (DcgmScrapeError, asyncio.CancelledError):
            # Cancelled: the pipeline's receiver timeout ran out before ours. That is a failed scrape
            # too, or a hung endpoint would never be rediscovered.
            self.failures += 1
            raise
        self.failures = 0
        for problem in scrape.problems:
            self._warn("rows", f"{redact(endpoint)}: {problem}")
        if scrape.unusable:
            self._warn(
                "unusable",
                f"{redact(endpoint)}: {scrape.unusable} DCGM series skipped "
                "(no UUID label, or a GPU_I_ID that is not a number)",
            )
        if not scrape.series:
            self._warn(
                "empty",
                f"{redact(endpoint)} answered {scrape.other} series but no DCGM field of any GPU: "
                "is this dcgm-exporter?",
            )
        new = self._collections.observe(scrape.series, now.monotonic_s)
        return to_records(scrape.series, now, new, self.config.collect_interval)

    @staticmethod
    def _parse(endpoint: str, body: bytes) -> Scrape:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise DcgmScrapeError(endpoint, "garbage", "the answer is not UTF-8 text; not a metrics page") from None
        try:
            return parse_exposition(text)
        except ParseError as exc:
            raise DcgmScrapeError(endpoint, "garbage", f"the answer is not Prometheus text ({exc})") from None

    def _headers(self, endpoint: str) -> dict[str, str]:
        token = self.config.bearer_token.get_secret_value() if self.config.bearer_token is not None else ""
        if self.config.bearer_token_file:
            try:
                token = Path(self.config.bearer_token_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise DcgmScrapeError(
                    endpoint, "auth", f"cannot read bearer_token_file {self.config.bearer_token_file} ({exc.strerror})"
                ) from None
        return {"Authorization": f"Bearer {token}"} if token else {}

    # --- discovery ------------------------------------------------------------------------

    async def _endpoint(self) -> str:
        """The endpoint to scrape now. The first lookup is waited for; later ones run in the background
        while the last known endpoint is still scraped."""
        if self.config.endpoint:
            return self.config.endpoint
        if self._discovery is not None and self._discovery.done():
            # Cancelled only if a tick's timeout cancelled the wait before the lookup began: look again.
            pending, self._discovery = self._discovery, None
            if not pending.cancelled():
                self._apply(pending.result())
        if self.endpoint is None:
            self._apply(await asyncio.wrap_future(self._discover()))
        elif self.failures >= self.config.rediscover_after and self._discovery is None:
            self.rl.log.log(
                logging.INFO,
                "rediscover",
                f"receiver {self.component_id}: {self.failures} scrapes of {redact(self.endpoint)} failed in a row; "
                "looking for dcgm-exporter again",
            )
            self._discover()
        assert self.endpoint is not None
        return self.endpoint

    def _discover(self) -> Future[Discovery]:
        if self._discovery is None:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dcgm-discovery")
            scheme = "https" if self.config.tls.configured else "http"
            self._discovery = self._executor.submit(
                discover,
                self._env,
                label_selector=self.config.discovery_label_selector,
                port=self.config.discovery_port,
                scheme=scheme,
                timeout_s=self.config.timeout,
            )
        return self._discovery

    def _apply(self, found: Discovery) -> None:
        self._discovery = None
        if found.endpoint != self.endpoint:
            if found.found:
                self.log.info("receiver %s: scraping %s (%s)", self.component_id, found.endpoint, found.how)
            else:
                self._warn("discovery", f"dcgm-exporter not discovered: {found.how}")
        self.endpoint = found.endpoint
        self.failures = 0

    def _warn(self, key: str, message: str) -> None:
        self.rl.log.log(logging.WARNING, key, f"receiver {self.component_id}: {message}")


factory = Factory.of(
    DcgmReceiver,
    type="dcgm",
    kind="receiver",
    config_model=DcgmConfig,
    description="dcgm-exporter's /metrics: activity per MIG instance, and every per-GPU field in SI units.",
    stability="development",
    provides=_PROVIDES,
)
