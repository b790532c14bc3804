"""Loads a saved PipelineModel in a fresh SparkSession and writes its predictions.

Usage: python load_pipeline.py MODEL_DIR DATA_PARQUET OUT_NPY, or from a test
:func:`in_new_process`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np
from pyspark.ml import PipelineModel

from tests.integration.conftest import set_log_level, spark_builder


def in_new_process(
    model_dir: str, data_path: str, out_path: str, env: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    """Runs this script in a process of its own with ``env`` (on 127.0.0.1)."""
    return subprocess.run(
        [sys.executable, os.path.abspath(__file__), model_dir, data_path, out_path],
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "SPARK_LOCAL_IP": "127.0.0.1"},
    )


def main() -> None:
    model_dir, data_path, out_path = sys.argv[1:4]
    spark = spark_builder("local[1]").getOrCreate()
    set_log_level(spark, "ERROR")
    loaded = PipelineModel.load(model_dir)
    rows = loaded.transform(spark.read.parquet(data_path)).orderBy("id").collect()
    np.save(out_path, np.array([r.prediction for r in rows], np.float32))
    print("CLASSES", sum(1 for r in rows if r["class"] == r.label))
    spark.stop()


if __name__ == "__main__":
    main()
