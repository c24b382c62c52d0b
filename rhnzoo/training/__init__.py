"""Training: one run engine and the tasks that run on it.

* :mod:`rhnzoo.training.engine`: the loop (workdir, checkpoints, exact resume,
  signals, divergence stop, metrics, progress, final evaluation); each task's
  ``train_and_evaluate`` hands it an ``engine.Task``.
* :mod:`rhnzoo.training.progress`: what a run reports as it goes (running loss sums and
  the divergence check, time per step and estimates, the printed lines).
* :mod:`rhnzoo.training.workdir`: a run's directory: config check, checkpoints,
  metrics log, strict JSON.
* :mod:`rhnzoo.training.sharding`: data parallelism over ``Mesh(("data",))``.
* :mod:`rhnzoo.training.lm`: language modelling with truncated BPTT.
* :mod:`rhnzoo.training.polyphonic`: piano-roll models (JSB Chorales).
* :mod:`rhnzoo.training.highway`: feed-forward highway / plain nets (MNIST, CIFAR-100).
* :mod:`rhnzoo.training.rrl`: sequence classification (IMDB, P-MNIST, AG News, 20NG).
* :mod:`rhnzoo.training.classify`: batches, cross-entropy sums and evaluation shared by
  the two classification tasks.
* :mod:`rhnzoo.training.sweep`: the multi-run runner (runs in turn or in child
  processes, ``--jobs`` / ``--seeds``); :mod:`rhnzoo.training.tables`: its tables.
* :mod:`rhnzoo.training.signals`: SIGTERM / SIGINT as a clean stop.

The experiments' flags and bodies are above this package, in :mod:`rhnzoo.apps`.
"""
