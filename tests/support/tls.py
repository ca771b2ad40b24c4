"""A throwaway PKI made with the openssl command: a CA, a server certificate for 127.0.0.1/localhost, and
client certificates from that CA and from a stranger's CA (for mutual TLS tests)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path          # a client certificate from another CA
    stranger_key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    crt, key = d / f"{name}.crt", d / f"{name}.key"
    _openssl("req", "-x509", *EC, "-days", "2", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(crt),
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return crt, key


def _leaf(d: Path, name: str, ca: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    crt, key, csr, extfile = d / f"{name}.crt", d / f"{name}.key", d / f"{name}.csr", d / f"{name}.ext"
    extfile.write_text(ext + "\nbasicConstraints=CA:FALSE\n")
    _openssl("req", *EC, "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-days", "2", "-out", str(crt), "-extfile", str(extfile))
    return crt, key


def make_pki(d: Path) -> Pki:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is missing: `make test-deps` installs it (Debian: openssl)")
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca(d, "test-ca")
    server = _leaf(d, "server", ca, "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth")
    client = _leaf(d, "client", ca, "extendedKeyUsage=clientAuth")
    stranger = _leaf(d, "stranger", _ca(d, "other-ca"), "extendedKeyUsage=clientAuth")
    for key in d.glob("*.key"):
        key.chmod(0o600)
    return Pki(ca[0], *server, *client, *stranger)
