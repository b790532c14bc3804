"""The worker's side of the service's TLS: trust the fit's own certificate and nothing else.

The driver makes a certificate for each fit (:mod:`sparkdl.server.web.tls`); it travels
to the workers in their payload, and their client pins it.

Example:
    >>> from sparkdl.server.web.tls import Certificate
    >>> client_context(Certificate.make("127.0.0.1").pem).verify_mode.name
    'CERT_REQUIRED'
"""

from __future__ import annotations

import ssl

__all__ = ["client_context"]


def client_context(pem: bytes) -> ssl.SSLContext:
    """A client context that trusts the fit's certificate and nothing else.

    The host name is not matched: the certificate is the only trust anchor and only
    the driver holds its key, so whoever answers with it is the fit's service, at
    whatever address the worker reached it.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=pem.decode("ascii"))
    return context
