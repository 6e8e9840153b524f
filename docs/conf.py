"""Sphinx configuration of tide's documentation (`make docs`; contributing/docs.md says why)."""

project = "tide"
author = "the tide authors"
copyright = "the tide authors"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# docs/results/ holds the benchmark JSON lines the results page is generated from.
exclude_patterns = ["_build", "results"]

# Strict: every reference must resolve (sphinx-build -n -W), and `[text](page.md#anchor)` links
# are checked against the headings' anchors (up to level 4).
nitpicky = True
myst_heading_anchors = 4

html_theme = "alabaster"
html_title = "tide"
html_static_path: list[str] = []
