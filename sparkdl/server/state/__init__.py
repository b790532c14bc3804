"""The parameter service's training state: the center, rounds, ledger, history, checkpoints.

Plain Python and numpy: nothing here imports Flask or :mod:`sparkdl.server.web`.
"""
