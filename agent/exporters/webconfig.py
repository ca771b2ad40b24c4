"""TLS and basic auth for /metrics from [metrics], the way exporter-toolkit's web config sets them up."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import ssl
import threading
from typing import Any, Mapping, Optional

from agent.config import ConfigError, MetricsConfig

log = logging.getLogger(__name__)

# exporter-toolkit's client_auth_type values that Python's ssl module can honour. RequestClientCert and
# RequireAnyClientCert ask for a certificate without verifying it; OpenSSL through Python verifies any
# certificate it asks for, so those two are refused at load (config_checks.check_client_auth_type).
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


def _readable(key: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"key 'metrics.{key}': cannot read {path}: {exc.strerror}") from None


def tls_context(cfg: MetricsConfig) -> Optional[ssl.SSLContext]:
    """The server-side SSLContext for [metrics], or None to serve plain HTTP. Raises ConfigError naming
    the key whose file cannot be read or used."""
    problem = cfg.cross_check()
    if problem:
        raise ConfigError(problem)
    if not cfg.tls_cert_file:
        return None
    assert cfg.tls_key_file is not None  # cross_check: both or neither
    _readable("tls_cert_file", cfg.tls_cert_file)
    _readable("tls_key_file", cfg.tls_key_file)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[cfg.tls_min_version]
    # TLS 1.2 renegotiation costs the server a handshake per request of the client's choosing (CVE-2011-1473).
    ctx.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    try:
        ctx.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file)
    except ssl.SSLError as exc:
        raise ConfigError(f"key 'metrics.tls_key_file': {cfg.tls_key_file} is not the PEM private key of "
                          f"{cfg.tls_cert_file}, or one of them is not PEM ({exc.reason or exc})") from None
    auth_type = cfg.effective_client_auth_type
    if cfg.tls_client_ca_file:
        _readable("tls_client_ca_file", cfg.tls_client_ca_file)
        try:
            ctx.load_verify_locations(cafile=cfg.tls_client_ca_file)
        except ssl.SSLError as exc:
            raise ConfigError(f"key 'metrics.tls_client_ca_file': {cfg.tls_client_ca_file} holds no PEM "
                              f"certificate ({exc.reason or exc})") from None
    ctx.verify_mode = CLIENT_AUTH[auth_type]
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class BasicAuth:
    """HTTP basic auth against bcrypt hashes (exporter-toolkit's basic_auth_users).

    bcrypt runs once per new (user, password) pair, under one lock, as exporter-toolkit does: a scrape every
    few seconds would otherwise cost a bcrypt each (~50 ms at cost 10), and concurrent wrong guesses can use
    one core at most. What is remembered is an HMAC of the accepted password under a key drawn at start,
    compared in constant time; an unknown user costs the same bcrypt as a known one, so timing does not
    tell which user names exist."""

    def __init__(self, users: Mapping[str, str]) -> None:
        import bcrypt  # python3-bcrypt; imported only when users are configured

        self._bcrypt: Any = bcrypt
        self._users = {u: h.encode("ascii") for u, h in users.items()}
        self._key = os.urandom(32)
        self._accepted: dict[str, bytes] = {}
        self._lock = threading.Lock()
        cost = max(int(h.split("$")[2]) for h in users.values())
        self._decoy = bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(rounds=cost))

    @staticmethod
    def credentials(header: Optional[str]) -> Optional[tuple[str, bytes]]:
        if not header:
            return None
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            raw = base64.b64decode(token.strip(), validate=True)
            user_b, sep, password = raw.partition(b":")
            user = user_b.decode("utf-8")
        except (binascii.Error, ValueError):
            return None
        return (user, password) if sep else None

    def __call__(self, header: Optional[str], may_block: bool) -> Optional[bool]:
        creds = self.credentials(header)
        if creds is None:
            return False
        user, password = creds
        tag = hmac.new(self._key, password, hashlib.sha256).digest()
        known = self._accepted.get(user)
        if known is not None and hmac.compare_digest(known, tag):
            return True
        if not may_block:
            return None
        hashed = self._users.get(user, self._decoy)
        with self._lock:
            try:
                ok = bool(self._bcrypt.checkpw(password, hashed))
            except ValueError:  # NUL bytes or an over-long password, which bcrypt refuses
                ok = False
        if ok and user in self._users:
            self._accepted[user] = tag
            return True
        log.debug("metrics: basic auth failed for user %r", user[:64])
        return False


def basic_auth(cfg: MetricsConfig) -> Optional[BasicAuth]:
    if not cfg.basic_auth_users:
        return None
    try:
        auth = BasicAuth(cfg.basic_auth_users)
    except ImportError:
        raise ConfigError("key 'metrics.basic_auth_users' needs the bcrypt module (Debian/Ubuntu: python3-bcrypt, "
                          "Amazon Linux: python3-bcrypt)") from None
    if not cfg.tls_cert_file:
        log.warning("metrics: basic auth is on without TLS (metrics.tls_cert_file): passwords cross the network "
                    "in clear text")
    return auth
