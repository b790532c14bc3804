"""Hyper-parameter search on Spark: each trial a distributed fit, several at once.

:class:`Search` asks Optuna for trials (its samplers, pruners and storages), runs each
as a :class:`~sparkdl.estimator.KerasEstimator` fit of its own (its own Spark job group
and parameter service), as many at once as the cluster's task slots hold, reports every
epoch's merged metrics to the trial and stops a trial its pruner gives up on.

Example:
    >>> from sparkdl.search import Search, SearchResult
    >>> Search.__name__, SearchResult.__name__
    ('Search', 'SearchResult')
"""

from sparkdl.search.search import Search, SearchResult

__all__ = ["Search", "SearchResult"]
