"""Sphinx configuration of the workbench's documentation site (``make docs``; the tests build it with ``-W``).

Sphinx with MyST, because the docstrings are written with Sphinx roles (``:class:``, ``:func:``, …) that autodoc
renders as cross-references; the pages are Markdown. The CLI and API references are generated at build time
(``docs/_ext/reference_pages.py``), so a command or a module cannot be missing from them.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "workbench"
author = "the workbench maintainers"
copyright = "the workbench maintainers, Apache-2.0"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "reference_pages", "notebook_pages"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "notebook_runs", "Thumbs.db", ".DS_Store"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_inherit_docstrings = False          # library base classes' docstrings are theirs, not ours
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
html_theme = "furo"
html_title = "workbench"
