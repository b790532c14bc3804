"""The parameter service's HTTP machinery: Flask routes, the WSGI server, transport, TLS."""
