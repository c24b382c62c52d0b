"""The studies: a paper's many runs, its tables and the paper's numbers beside ours,
above the tasks (:mod:`rhnzoo.tasks`) and below the applications (:mod:`rhnzoo.apps`).

* :mod:`rhnzoo.studies.sweep`: the one multi-run runner (runs in turn or in child
  processes, ``--jobs`` / ``--seeds``).
* :mod:`rhnzoo.studies.tables`: the tables of every study.
* :mod:`rhnzoo.studies.rrl_table3`: Wang & Tian's Table 3 and the recipe studies.
* :mod:`rhnzoo.studies.jsb`: the JSB Chorales random search (Zilly et al., Fig. 4).
* :mod:`rhnzoo.studies.hsg_depth`: the HSG depth sweep (Shoham & Permuter, Table 1).
* :mod:`rhnzoo.studies.highway`: the highway / plain depth sweep (Srivastava et al.).

The harvest that fills the papers' tables at their own sizes in borrowed GPU windows and
CPU chunks is a tool of the project, not of the package: ``tools/harvest/``.
"""
