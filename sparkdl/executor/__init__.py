"""The executor side of a fit: code that runs only inside a Spark task, with Keras.

The driver never imports this package: it ships a :class:`~sparkdl.contract.payload.WorkerPayload`
and a function that imports :mod:`sparkdl.executor.task` (the task entry) on the
executor. The task entry imports no Keras; it starts importing the training loop and
callback (Keras and TensorFlow at their top) in a thread while it reads the partition.
One push, from the training loop outwards:

* :mod:`sparkdl.executor.training`: rebuilds the model, works out the schedule and
  runs ``model.fit`` over the epochs;
* :mod:`sparkdl.executor.callback`: the Keras callback that syncs at the schedule's
  points and applies what the driver decided (stop, learning rate);
* :mod:`sparkdl.executor.pusher`: turns the local weights into a push with the fit's
  merge, sends it (waiting, or in the background with ``overlap``) and folds the
  answer in.
* :mod:`sparkdl.executor.channel`: the worker's one channel to the service, its
  client and its pusher, whatever the number of the service's shards (the one place
  here that tells one service from shards).
"""
