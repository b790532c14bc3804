"""Fit on local-cluster with a fake GPU per worker; prints each worker's GPU report.

Usage: python fake_gpu_fit.py DISCOVERY_SCRIPT
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from examples.digits import digits_frames, digits_model
from sparkdl import KerasEstimator
from tests.integration.conftest import spark_builder


def main() -> None:
    script = sys.argv[1]
    spark = (
        spark_builder("local-cluster[2,1,1024]")
        .config("spark.worker.resource.gpu.amount", "1")
        .config("spark.worker.resource.gpu.discoveryScript", script)
        .config("spark.executor.resource.gpu.amount", "1")
        .config("spark.task.resource.gpu.amount", "1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    train_df, _ = digits_frames(spark, partitions=2)
    fitted = KerasEstimator(model=digits_model(), num_workers=2, epochs=2, seed=0).fit(train_df)
    for w in fitted.fit_report["workers"]:
        print(
            "GPU_REPORT "
            + json.dumps({k: w[k] for k in ("worker", "gpu_ids", "cuda_visible_devices", "gpus")})
        )
    spark.stop()


if __name__ == "__main__":
    main()
