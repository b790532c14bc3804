"""Sphinx configuration of sparkdl's documentation site.

Sphinx with MyST (Markdown pages), autodoc and napoleon (the Google-style docstrings of
``sparkdl/``), built strictly by ``bash scripts/docs.sh``: a warning fails the build.
The settings reference is generated from :class:`sparkdl.config.TrainConfig` by
``_ext/settings_reference.py``, so each setting is described in one place.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_ext"))
sys.path.insert(0, os.path.dirname(HERE))
import sparkdl  # noqa: E402

with sparkdl.quiet_tensorflow():  # autodoc imports Keras: keep TensorFlow's lines out
    import keras  # noqa: F401

project = "sparkdl"
author = "the sparkdl authors"
copyright = "2026, the sparkdl authors"
release = version = sparkdl.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "settings_reference",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
root_doc = "index"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_default_options = {"members": True, "show-inheritance": True}
# Type hints name classes of pyspark and keras that have no inventory here (no network
# at build time, so no intersphinx): leave them as text.
autodoc_mock_imports: list[str] = []
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# "Attributes:" sections become fields of their class, not objects of their own (which
# would clash with the properties autodoc documents).
napoleon_use_ivar = True

html_theme = "furo"
html_title = f"sparkdl {release}"
html_static_path: list[str] = []
suppress_warnings = ["myst.header"]
