"""A batch training job for spark-submit: digits MLP from a Parquet data set.

    spark-submit --master local-cluster[2,1,1024] examples/digits_job.py \
        --data /tmp/digits.parquet --model digits_job:build_model \
        --output /tmp/digits-model --config conf/train-digits.json

The job is sparkdl's command line (``python -m sparkdl``); this file adds the function
that builds the compiled model (``--model digits_job:build_model``). spark-submit puts
this file's directory on the driver's path, so the module imports as ``digits_job``.
"""

from __future__ import annotations

import sys
from typing import Any


def build_model(learning_rate: float = 0.003) -> Any:
    """A compiled 64-64-10 MLP for scikit-learn's digits (``examples/digits.py``)."""
    from digits import digits_model  # the module next to this file

    return digits_model(seed=0, learning_rate=learning_rate)


if __name__ == "__main__":
    from sparkdl.tools.cli import main

    sys.exit(main())
