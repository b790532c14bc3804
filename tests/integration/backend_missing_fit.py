"""A digits fit whose executors run another Python (``PYSPARK_PYTHON``, set by the
caller), one without the driver's Keras backend: prints ``ERROR <type>: <message>`` of
the fit's error.

Run by tests/integration/test_backends.py in its own process (a process has one
SparkContext, and its executors' Python is fixed when it starts).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from examples.digits import digits_frames, digits_model
from sparkdl import KerasEstimator
from tests.integration.conftest import set_log_level, spark_builder

spark = spark_builder("local[2]").getOrCreate()
set_log_level(spark, os.environ.get("LOGLEVEL", "OFF"))
train_df, _ = digits_frames(spark)
try:
    KerasEstimator(model=digits_model(), num_workers=2, epochs=1, verbose=0).fit(train_df)
    print("FITTED")
except Exception as exc:
    print(f"ERROR {type(exc).__name__}: {exc}")
spark.stop()
