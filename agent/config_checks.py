"""The value checks of burstwatch's config keys: each returns None, or what is wrong with the value."""

from __future__ import annotations

import ipaddress
from typing import Any, Callable, Optional

Validator = Callable[[Any], Optional[str]]


def check_hostport(value: str) -> str | None:
    host, sep, port = value.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        return f"{value!r} is not host:port with a port from 1 to 65535"
    if host.startswith("[") != host.endswith("]"):
        return f"{value!r} has an unbalanced IPv6 bracket"
    return None


def split_hostport(value: str) -> tuple[str, int]:
    """'0.0.0.0:9786' -> ('0.0.0.0', 9786); '[::]:9786' -> ('::', 9786)."""
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


def check_cidrs(value: list[str]) -> str | None:
    for item in value:
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            return f"{item!r} is not a CIDR (e.g. 10.0.0.0/8)"
    return None


def check_peers(value: list[str]) -> str | None:
    for item in value:
        host, sep, port = item.rpartition(":")
        if sep and not host.endswith("]") and ":" in host:
            continue  # bare IPv6 address
        if sep and (not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536):
            return f"peer {item!r} has an invalid port"
        if not (host if sep else item).strip("[]"):
            return f"peer {item!r} has no host"
    return None


def check_url(value: str) -> str | None:
    if not value.startswith(("http://", "https://")):
        return f"{value!r} is not an http:// or https:// URL"
    return None


def check_log_level(value: str) -> str | None:
    if value.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        return f"{value!r} is not one of debug, info, warning, error"
    return None


def check_shaping(value: str) -> str | None:
    if value not in ("auto", "ethtool", "tc", "none"):
        return f"{value!r} is not one of auto, ethtool, tc, none"
    return None


def check_tag(value: str) -> str | None:
    if not value.partition("=")[0].strip():
        return f"{value!r} has no tag key (expected KEY or KEY=VALUE, e.g. burstwatch:peer=true)"
    return None


def check_directions(value: list[str]) -> str | None:
    if not value or len(set(value)) != len(value) or any(d not in ("out", "in") for d in value):
        return f"{value!r} is not a non-empty list of distinct directions \"out\" and \"in\""
    return None


def check_abs_path(value: str) -> str | None:
    if not value.startswith("/"):
        return f"{value!r} is not an absolute path"
    return None


# exporter-toolkit's client_auth_type names; its RequestClientCert and RequireAnyClientCert take a client
# certificate without verifying it, which Python's ssl module cannot do (docs/security.md).
CLIENT_AUTH_TYPES = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")


def check_client_auth_type(value: str) -> str | None:
    if value not in CLIENT_AUTH_TYPES:
        return f"{value!r} is not one of {', '.join(CLIENT_AUTH_TYPES)}"
    return None


def check_tls_version(value: str) -> str | None:
    if value not in ("TLS12", "TLS13"):
        return f"{value!r} is not TLS12 or TLS13"
    return None


_BCRYPT_ALPHABET = frozenset("./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def check_bcrypt_users(value: dict[str, str]) -> str | None:
    for user, hashed in value.items():
        if not user or ":" in user or any(ord(c) < 32 for c in user):
            return f"user name {user!r} is empty or holds ':' or a control character"
        parts = hashed.split("$")  # "$2y$10$" + 22 characters of salt + 31 of hash
        if not (len(parts) == 4 and parts[0] == "" and parts[1] in ("2a", "2b", "2y") and len(parts[2]) == 2
                and parts[2].isdigit() and 4 <= int(parts[2]) <= 31 and len(parts[3]) == 53
                and set(parts[3]) <= _BCRYPT_ALPHABET):
            return (f"the hash of user {user!r} is not a bcrypt hash ($2y$10$ and 53 characters, as "
                    f"`htpasswd -nBC 10 {user}` prints after the colon)")
    return None


PER_INSTANCE = ("always", "when_draining", "never")


def check_per_instance(value: str) -> Optional[str]:
    return None if value in PER_INSTANCE else f"{value!r} is not one of {', '.join(PER_INSTANCE)}"


def check_aggregation_dimensions(value: list[list[str]]) -> Optional[str]:
    """Names CloudWatch takes (1-255 ASCII, not starting with ':'), none twice in a set, and room beside
    Peer/Direction (30 dimensions a metric). Sets that differ only in order are one set (the CloudWatch agent
    published them twice: aws/amazon-cloudwatch-agent#672); the publisher merges them."""
    for dims in value:
        for name in dims:
            if not name.strip() or len(name) > 255 or name.startswith(":") or not name.isascii():
                return f"dimension name {name!r} must be 1-255 ASCII characters, not starting with ':'"
        if len(set(dims)) != len(dims):
            return f"{dims!r} names a dimension twice"
        if len(dims) > 28:
            return f"{dims!r} has {len(dims)} dimensions; at most 28 fit beside Peer and Direction"
    return None
