"""The studies: a paper's many runs, its tables and the paper's numbers beside ours, on
the one multi-run runner (:mod:`rhnzoo.studies.sweep`). The harvest that fills the
papers' tables at their own sizes is a tool of the project, not of the package:
``tools/harvest/``.
"""
