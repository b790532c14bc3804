"""TLS for the parameter service: a certificate made for each fit, pinned by its workers.

On a cluster the token and the weights cross the network on every request, so the
service speaks HTTPS there (``service_tls``, on by default when the master is not
local). The driver makes a fresh key and a self-signed certificate for each fit
(:meth:`Certificate.make`, the ``cryptography`` package); the certificate travels to
the workers in their payload, and a worker trusts that certificate alone
(:func:`sparkdl.protocol.tls.client_context`): no certificate authority is involved, and a
man in the middle would need the fit's private key, which never leaves the driver's memory and a
temporary file only the driver's user can read, removed once the server loaded it.

The server does the TLS handshake on the connection's own thread, at its first read,
not in cheroot's accepting thread: a client that connects and says nothing cannot hold
up every other connection (:class:`sparkdl.server.web.transport.DeferredHandshakeAdapter`).

Example:
    >>> cert = Certificate.make("127.0.0.1")
    >>> cert.pem.startswith(b"-----BEGIN CERTIFICATE-----")
    True
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

__all__ = ["VALID_DAYS", "Certificate", "temporary_directory"]

#: How long a fit's certificate is valid (a fit longer than this would need a new one).
VALID_DAYS = 90


@dataclass(frozen=True)
class Certificate:
    """A fit's certificate (PEM, public) and its private key (PEM, never sent).

    Attributes:
        pem: The certificate, which workers pin.
        key: The private key.
    """

    pem: bytes
    key: bytes = field(repr=False)

    @classmethod
    def make(cls, host: str) -> Certificate:
        """A new EC P-256 key and a self-signed certificate naming ``host``."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sparkdl parameter service")])
        try:
            alt: Any = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alt = x509.DNSName(host)
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(
            pem=cert.public_bytes(serialization.Encoding.PEM),
            key=key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )

    def adapter(self, directory: str) -> Any:
        """cheroot's TLS adapter for this certificate; its files go in ``directory``
        (readable by this user only; the caller removes it)."""
        cert_file = os.path.join(directory, "service.pem")
        key_file = os.path.join(directory, "service.key")
        for path, data in ((cert_file, self.pem), (key_file, self.key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        from sparkdl.server.web.transport import DeferredHandshakeAdapter  # the driver's side

        return DeferredHandshakeAdapter(cert_file, key_file)


def temporary_directory() -> tempfile.TemporaryDirectory[str]:
    """A directory for a fit's key files, readable by this user only."""
    return tempfile.TemporaryDirectory(prefix="sparkdl-tls-")
