"""The sync protocol: how workers and the parameter service exchange weights.

Three concepts, each a small class named once:

* :mod:`sparkdl.sync.merges`: a *merge* says what a worker pushes, how it folds the
  service's answer in, and how the service combines pushes into the center.
* :mod:`sparkdl.sync.modes`: a *mode* schedules pushes. Its worker half says how many
  syncs an epoch has and where a retried task resumes; its service half (a synchronous
  round, or one asynchronous update under a lock or none) is the parameter service's
  policy for it (:mod:`sparkdl.server.state.policies`).
* :mod:`sparkdl.sync.schedule`: the worker's sync points within its epochs (pure
  arithmetic, the same on every worker of a synchronous round).

Every module here is plain numpy and Python (no Keras, no Spark, no Flask, nothing
of :mod:`sparkdl.server`): the driver, the service and the executors share it.
"""
