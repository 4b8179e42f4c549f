"""A memcached with TLS (``-Z``) and a self-signed certificate for 127.0.0.1, made per test session.

The certificate is made with the ``openssl`` command (Debian's ``openssl``
package, in every image the project runs on); memcached must be built with TLS
(Debian's 1.6.18 is: ``memcached -h | grep ssl``).  Missing either skips loudly,
or fails under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import (
    IN_CI,
    LOOPBACK,
    MemcachedServer,
    require_binary,
    start_memcached,
    stop_all,
)


@dataclass(frozen=True)
class Certificate:
    cert: Path
    key: Path

    def client_context(self) -> ssl.SSLContext:
        """What a user passes as ``OPTIONS["tls_context"]``: trusts this certificate only."""
        return ssl.create_default_context(cafile=str(self.cert))


def make_certificate(directory: Path) -> Certificate:
    """A self-signed EC certificate valid for the IP address 127.0.0.1."""
    openssl = require_binary("openssl")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            openssl,
            *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-nodes", "-days", "2", "-subj", "/CN=django-mcpatterns tests"),
            *("-addext", f"subjectAltName=IP:{LOOPBACK}"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return Certificate(cert, key)


def require_tls_memcached() -> None:
    help_text = subprocess.run(
        [require_binary("memcached"), "-h"], capture_output=True, text=True, timeout=30
    ).stdout
    if "--enable-ssl" not in help_text:
        reason = "this memcached is built without TLS (memcached -h shows no --enable-ssl)"
        if IN_CI:
            pytest.fail(reason, pytrace=False)
        pytest.skip(f"!!! SKIPPED: {reason}")


@contextlib.contextmanager
def tls_memcached(certificate: Certificate) -> Iterator[MemcachedServer]:
    """One memcached that speaks only TLS, with ``certificate``."""
    require_tls_memcached()
    options = f"ssl_chain_cert={certificate.cert},ssl_key={certificate.key}"
    servers = start_memcached(1, extra_args=("-Z", "-o", options))
    try:
        yield servers[0]
    finally:
        stop_all(servers)
