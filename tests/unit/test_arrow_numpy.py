"""pyarrow that cannot load beside this numpy: the error names the pip line that fixes it."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_pyarrow_that_needs_numpy_2_is_refused_with_the_pip_line(tmp_path) -> None:
    """What pip resolves for a numpy 1.x stack (pyarrow 26, which declares no numpy
    requirement): its import fails; importing the estimator fails at once with the pip
    line that fixes it."""
    fake = tmp_path / "pyarrow"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        'raise ImportError("pyarrow requires NumPy 2.0 or newer, found 1.26.4")\n'
    )
    code = (
        "from sparkdl.errors import ConfigError\n"
        "try:\n"
        "    from sparkdl import KerasEstimator\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "requires NumPy 2.0 or newer" in out.stdout
    assert 'pip install "pyarrow>=10.0.1,<26"' in out.stdout, out.stdout
