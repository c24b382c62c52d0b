"""Training: one run engine and the tasks that run on it.

* :mod:`rhnzoo.training.engine`: the loop (workdir, checkpoints, exact resume,
  signals, divergence stop, metrics, progress, final evaluation).
* :mod:`rhnzoo.training.sharding`: data parallelism over ``Mesh(("data",))``.
* :mod:`rhnzoo.training.lm`: language modelling with truncated BPTT.
* :mod:`rhnzoo.training.polyphonic`: piano-roll models (JSB Chorales).
"""
