"""The parameter service: its HTTP machinery (:mod:`sparkdl.server.web`: Flask routes on
cheroot, transport, TLS) over its training state (:mod:`sparkdl.server.state`). The wire
format and the workers' client are :mod:`sparkdl.protocol`."""
