"""The parameter service: Flask routes on cheroot, its state split by job, wire, client."""
