"""TLS and basic auth for the HTTP listeners, from a web config file in the Prometheus exporter-toolkit format.

Supported keys (anything else is an error, so a security setting is never silently ignored)::

    tls_server_config:
      cert_file: server.crt         # relative paths are relative to the web config file
      key_file: server.key
      client_ca_file: ca.crt        # optional: clients must present a certificate signed by this CA
      client_auth_type: RequireAndVerifyClientCert   # or VerifyClientCertIfGiven; needs client_ca_file
    basic_auth_users:
      prometheus: $2y$10$...        # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\\n')

Everything is checked when the file is loaded (certificates and keys included, by building the
``ssl.SSLContext``), so a bad file stops ``wattpipe validate`` and startup instead of serving plain HTTP.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import ssl
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from wattpipe.pipeline.errors import ConfigError
from wattpipe.pipeline.httpserver import HttpServer, WsgiApp

__all__ = ["WebConfig", "load_web_config", "serve"]

_TOP_KEYS = ("tls_server_config", "basic_auth_users")
_TLS_KEYS = ("cert_file", "key_file", "client_ca_file", "client_auth_type")
_CLIENT_AUTH = {"RequireAndVerifyClientCert": ssl.CERT_REQUIRED, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL}
# $2a$/$2b$/$2y$ (htpasswd writes 2y), a two-digit cost, then 22 salt + 31 hash characters.
_BCRYPT = re.compile(r"^\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}$")
# Checked for unknown users too, so the answer takes as long whether or not the user exists (cost 10,
# htpasswd's default). Precomputed: hashing at import would cost every process ~50 ms.
_DUMMY_HASH = b"$2b$10$BfZkxz6g9pEu6rP0wP/WgO.nlqx6GoG.c5xWY0NRdqUbMVGVtwAKG"
_REALM = 'Basic realm="wattpipe"'


@dataclass(frozen=True, slots=True)
class WebConfig:
    """A loaded, checked web config: the TLS context (None: plain HTTP) and the basic-auth users."""

    source: str
    ssl_context: ssl.SSLContext | None
    basic_auth_users: Mapping[str, bytes]
    """user → bcrypt hash; empty: no authentication."""

    def wrap(self, app: WsgiApp) -> WsgiApp:
        """``app`` behind basic auth, or ``app`` itself when no users are configured."""
        if not self.basic_auth_users:
            return app
        users = self.basic_auth_users
        passed = _PassedChecks()

        def authenticated(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            if _check(users, environ.get("HTTP_AUTHORIZATION", ""), passed):
                return app(environ, start_response)
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain; charset=utf-8"), ("WWW-Authenticate", _REALM)],
            )
            return [b"Unauthorized\n"]

        return authenticated


def serve(listen: str, app: WsgiApp, web: WebConfig | None) -> HttpServer:
    """An :class:`HttpServer` for ``app`` with ``web``'s TLS and basic auth applied (plain without ``web``)."""
    if web is None:
        return HttpServer(listen, app)
    return HttpServer(listen, web.wrap(app), ssl_context=web.ssl_context)


class _PassedChecks:
    """Credentials that passed bcrypt already, by a digest of (user, hash, password): a scraper sends the same
    header every 15 s, and one bcrypt check (~70 ms of CPU at cost 10) per scrape would cost more than serving
    the page. Failures are never remembered, so a wrong password always pays the full check. Bounded."""

    _MAX = 256

    def __init__(self) -> None:
        self._seen: set[bytes] = set()
        self._lock = threading.Lock()

    @staticmethod
    def key(user: str, hashed: bytes, password: str) -> bytes:
        return hashlib.sha256(b"\0".join((user.encode(), hashed, password.encode()))).digest()

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            return key in self._seen

    def add(self, key: bytes) -> None:
        with self._lock:
            if len(self._seen) >= self._MAX:
                self._seen.clear()
            self._seen.add(key)


def _check(users: Mapping[str, bytes], header: str, passed: _PassedChecks) -> bool:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, sep, password = base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return False
    if not sep:
        return False
    hashed = users.get(user)
    key = _PassedChecks.key(user, hashed, password) if hashed is not None else None
    if key is not None and key in passed:
        return True
    try:
        ok = bcrypt.checkpw(password.encode(), hashed if hashed is not None else _DUMMY_HASH)
    except ValueError:  # bcrypt ≥ 5 refuses passwords over 72 bytes rather than truncating them
        return False
    if ok and key is not None:
        passed.add(key)
    return ok and hashed is not None


def load_web_config(path: str) -> WebConfig:
    """Read and check ``path``; raise :class:`ConfigError` naming the file and the key on any problem."""
    where = f"web config {path}"
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError([f"{where}: cannot be read: {exc.strerror or exc}"]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([f"{where}: is not valid YAML: {exc}"]) from exc
    if raw is None:
        raise ConfigError([f"{where}: is empty (remove web_config_file to serve plain HTTP)"])
    if not isinstance(raw, dict):
        raise ConfigError([f"{where}: must be a mapping with {' and/or '.join(_TOP_KEYS)}"])
    errors = [_unknown(where, "", key, _TOP_KEYS) for key in raw if key not in _TOP_KEYS]
    base = Path(path).parent
    context = _tls(where, base, raw.get("tls_server_config"), errors)
    users = _users(where, raw.get("basic_auth_users"), errors)
    if errors:
        raise ConfigError(errors)
    return WebConfig(source=path, ssl_context=context, basic_auth_users=users)


def _unknown(where: str, prefix: str, key: object, known: tuple[str, ...]) -> str:
    return f"{where}: {prefix}{key}: unknown or unsupported key (supported: {', '.join(known)})"


def _tls(where: str, base: Path, raw: object, errors: list[str]) -> ssl.SSLContext | None:
    if raw is None:
        return None
    key = "tls_server_config"
    if not isinstance(raw, dict):
        errors.append(f"{where}: {key}: must be a mapping with {', '.join(_TLS_KEYS)}")
        return None
    errors.extend(_unknown(where, f"{key}.", k, _TLS_KEYS) for k in raw if k not in _TLS_KEYS)
    files: dict[str, Path] = {}
    for name in ("cert_file", "key_file", "client_ca_file"):
        value = raw.get(name)
        if value is None and name == "client_ca_file":
            continue
        if not isinstance(value, str) or not value:
            errors.append(f"{where}: {key}.{name}: required, a file path")
            continue
        file = base / value
        if not file.is_file():
            errors.append(f"{where}: {key}.{name}: no such file: {file}")
            continue
        files[name] = file
    auth = raw.get("client_auth_type")
    if auth is not None and auth not in _CLIENT_AUTH:
        errors.append(f"{where}: {key}.client_auth_type: '{auth}' is not one of {', '.join(_CLIENT_AUTH)}")
    elif auth is not None and "client_ca_file" not in raw:
        errors.append(
            f"{where}: {key}.client_auth_type: needs client_ca_file (the CA client certificates are checked against)"
        )
    if errors or "cert_file" not in files or "key_file" not in files:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files["cert_file"], files["key_file"])
    except (ssl.SSLError, OSError) as exc:
        errors.append(f"{where}: {key}.cert_file/key_file: cannot be loaded as a certificate and its key: {exc}")
        return None
    if "client_ca_file" in files:
        try:
            context.load_verify_locations(cafile=files["client_ca_file"])
        except (ssl.SSLError, OSError) as exc:
            errors.append(f"{where}: {key}.client_ca_file: cannot be loaded as CA certificates: {exc}")
            return None
        # exporter-toolkit makes this explicit; a CA file alone means the operator wants client certificates.
        context.verify_mode = _CLIENT_AUTH[auth if isinstance(auth, str) else "RequireAndVerifyClientCert"]
    return context


def _users(where: str, raw: object, errors: list[str]) -> dict[str, bytes]:
    if raw is None:
        return {}
    key = "basic_auth_users"
    if not isinstance(raw, dict):
        errors.append(f"{where}: {key}: must be a mapping of user name to bcrypt hash")
        return {}
    users: dict[str, bytes] = {}
    for user, hashed in raw.items():
        if not isinstance(user, str) or not user or ":" in user:
            errors.append(f"{where}: {key}.{user}: not a valid user name (a non-empty string without ':')")
        elif not isinstance(hashed, str) or not _BCRYPT.match(hashed):
            errors.append(
                f"{where}: {key}.{user}: not a bcrypt hash (expected $2y$/$2b$/$2a$…, e.g. from htpasswd -nB)"
            )
        else:
            users[user] = hashed.encode()
    return users
