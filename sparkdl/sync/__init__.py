"""The sync protocol: how workers and the parameter service exchange weights.

Three concepts, each a small class with both halves, named once:

* :mod:`sparkdl.sync.merges`: a *merge* says what a worker pushes, how it folds the
  service's answer in, and how the service combines pushes into the center.
* :mod:`sparkdl.sync.modes`: a *mode* schedules pushes. Its service half runs a push
  (a synchronous round, or one asynchronous update under a lock or none); its worker
  half says how many syncs an epoch has and where a retried task resumes.
* :mod:`sparkdl.sync.schedule`: the worker's sync points within its epochs (pure
  arithmetic, the same on every worker of a synchronous round).

Every module here is plain numpy and Python (no Keras, no Spark, no Flask of its own):
the driver, the service and the executors share it.
"""
