"""The parameter service's training state: the center, rounds, ledger, history, checkpoints.

Nothing here imports Flask or :mod:`sparkdl.server.web` (Keras loads only inside the
driver's checkpoint callback, :func:`sparkdl.server.state.checkpoints.checkpoint_callback`).
"""
