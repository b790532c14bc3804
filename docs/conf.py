"""Sphinx configuration of sparkdl's documentation site.

Sphinx with MyST (Markdown pages), autodoc and napoleon (the Google-style docstrings of
``sparkdl/``), built strictly by ``bash scripts/docs.sh``: a warning fails the build,
and so does a reference to a sparkdl name that does not exist (nitpicky for sparkdl's
own names: ``_ext/sparkdl_refs.py``) or a link to an anchor that no page has
(``_ext/html_anchors.py``). The API reference lists the public API
(``reference/api.md``); each ``autoclass`` there names its members. The settings
reference is generated from :class:`sparkdl.config.TrainConfig` by
``_ext/settings_reference.py``, so each setting is described in one place.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_ext"))
sys.path.insert(0, os.path.dirname(HERE))
import sparkdl_refs  # noqa: E402

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
    "sparkdl_refs",
    "html_anchors",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
root_doc = "index"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
# No "members" default: a default of True replaces the member list a page names, so the
# reference would show every public method of every class it mentions (internals
# included) and drop the inherited ones it names. Each directive says what it shows.
autodoc_default_options = {"show-inheritance": True}
# Type hints name classes of pyspark and keras that have no inventory here (no network
# at build time, so no intersphinx): leave them as text.
autodoc_mock_imports: list[str] = []
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# "Attributes:" sections become fields of their class, not objects of their own (which
# would clash with the properties autodoc documents).
napoleon_use_ivar = True

# Nitpicky for sparkdl's own names only: a reference to ``sparkdl.<something>`` that does
# not exist fails the build (see _ext/sparkdl_refs.py, which links or places the others);
# numpy, pyspark, keras and the standard library have no inventory offline, so
# references to them stay text.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", sparkdl_refs.NOT_SPARKDL.pattern)]

html_theme = "furo"
html_title = f"sparkdl {release}"
html_static_path: list[str] = []
suppress_warnings = ["myst.header"]
