"""The examples of the home page, the getting-started guide and the README run as pasted.

Each page's ```` ```python ```` blocks run in order in one namespace, as a reader pastes
them into one session: the first block builds its own SparkSession (``getOrCreate``
returns the test session, bound to 127.0.0.1) and its own DataFrame, so a page whose
example stops running, or starts to need something it does not build, fails here.
"""

from __future__ import annotations

import os
import re

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = [
    "docs/index.md",
    "docs/getting-started.md",
    "docs/guides/images-and-sequences.md",
    "README.md",
]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(page: str) -> list[str]:
    """The page's ```` ```python ```` blocks, in order."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return BLOCK.findall(f.read())


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run_as_pasted(page, spark, tmp_path, monkeypatch) -> None:
    blocks = python_blocks(page)
    assert blocks, f"{page} has no python example"
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__main__"}
    for number, code in enumerate(blocks, 1):
        exec(compile(code, f"{page} (python block {number})", "exec"), namespace)
    fitted = namespace.get("fitted")
    assert fitted is not None, f"{page}'s example fits no model named fitted"
    assert fitted.history["accuracy"][-1] > 0.8, fitted.history
