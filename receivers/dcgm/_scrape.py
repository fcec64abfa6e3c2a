"""One HTTP GET of dcgm-exporter's /metrics, bounded in time and size, failing with a typed error.

The body is streamed and reading stops as soon as it passes ``max_bytes`` (a ``Content-Length`` over it
is refused before the first byte): a misconfigured endpoint or a runaway exporter costs one bounded
read, never the agent's memory. The limit applies to the decoded body, so a gzip bomb is refused too.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import httpx

__all__ = ["DcgmScrapeError", "ScrapeReason", "TlsOptions", "fetch", "redact", "ssl_context"]

ScrapeReason = Literal["unreachable", "timeout", "http_status", "oversized", "garbage", "auth"]


class DcgmScrapeError(Exception):
    """A scrape that produced nothing: which endpoint, what went wrong (``reason``), in words.

    The message never carries the bearer token or URL credentials, and is the same from one failure
    to the next of the same kind, so the runtime's rate-limited log folds the repeats into one line.
    """

    def __init__(self, endpoint: str, reason: ScrapeReason, detail: str) -> None:
        super().__init__(f"dcgm-exporter at {redact(endpoint)}: {detail}")
        self.endpoint = redact(endpoint)
        self.reason: ScrapeReason = reason
        self.detail = detail


def redact(url: str) -> str:
    """``url`` without a ``user:password@`` part."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass(frozen=True, slots=True)
class TlsOptions:
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    insecure_skip_verify: bool = False

    @property
    def configured(self) -> bool:
        return bool(self.ca_file or self.cert_file or self.insecure_skip_verify)


def ssl_context(tls: TlsOptions) -> ssl.SSLContext:
    """The TLS settings for https endpoints. Reads the files now: a missing one fails here, by name."""
    for label, path in (("ca_file", tls.ca_file), ("cert_file", tls.cert_file), ("key_file", tls.key_file)):
        if path and not Path(path).is_file():
            raise FileNotFoundError(f"{label} {path} does not exist or is not a file")
    try:
        context = ssl.create_default_context(cafile=tls.ca_file or None)
    except ssl.SSLError as exc:
        raise ValueError(f"ca_file {tls.ca_file} is not a PEM certificate bundle ({exc})") from None
    if tls.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if tls.cert_file:
        try:
            context.load_cert_chain(tls.cert_file, tls.key_file or None)
        except ssl.SSLError as exc:
            which = f"cert_file {tls.cert_file}" + (f" with key_file {tls.key_file}" if tls.key_file else "")
            raise ValueError(f"{which}: not a PEM certificate and its key ({exc})") from None
    return context


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def fetch(
    client: httpx.AsyncClient,
    endpoint: str,
    *,
    headers: dict[str, str],
    timeout_s: float,
    max_bytes: int,
) -> bytes:
    """The body of a 200 answer to GET ``endpoint``, or :class:`DcgmScrapeError`.

    ``timeout_s`` bounds the whole exchange (connect, headers, every chunk), not each step: a server
    trickling a byte a second cannot hold a tick hostage.
    """
    try:
        async with asyncio.timeout(timeout_s), client.stream("GET", endpoint, headers=headers) as response:
            if response.status_code != 200:
                raise DcgmScrapeError(
                    endpoint, "http_status", f"answered HTTP {response.status_code} {response.reason_phrase}"
                )
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise _oversized(endpoint, max_bytes)
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise _oversized(endpoint, max_bytes)
            return bytes(body)
    except DcgmScrapeError:
        raise
    except (TimeoutError, httpx.TimeoutException):
        raise DcgmScrapeError(endpoint, "timeout", f"no complete answer within {timeout_s:g}s") from None
    except httpx.DecodingError as exc:
        raise DcgmScrapeError(endpoint, "garbage", f"the answer's encoding is broken ({_describe(exc)})") from None
    except httpx.TransportError as exc:
        raise DcgmScrapeError(endpoint, "unreachable", f"unreachable ({_describe(exc)})") from None


def _oversized(endpoint: str, max_bytes: int) -> DcgmScrapeError:
    return DcgmScrapeError(
        endpoint, "oversized", f"the answer is larger than max_bytes ({max_bytes} bytes); refused, not parsed"
    )
