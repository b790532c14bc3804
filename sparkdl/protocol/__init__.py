"""The parameter service's wire format and the worker's client: no Flask, no training state."""
