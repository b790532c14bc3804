"""The docs' generated settings reference is the declarations', and every setting has one."""

from __future__ import annotations

import os
import sys

from sparkdl.config import setting_docs, setting_fields

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_setting_is_described_once_and_the_reference_is_fresh() -> None:
    docs = setting_docs()
    assert set(docs) == {f.name for f in setting_fields()}
    assert all(len(text) > 10 for text in docs.values()), docs
    sys.path.insert(0, os.path.join(ROOT, "docs", "_ext"))
    try:
        import settings_reference
    finally:
        sys.path.pop(0)
    with open(os.path.join(ROOT, "docs", settings_reference.PAGE)) as f:
        committed = f.read()
    assert committed == settings_reference.render(), (
        "docs/reference/settings.rst is stale: run bash scripts/docs.sh and commit it"
    )
