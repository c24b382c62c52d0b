"""The run engine: one training loop for every task, below the tasks.

* :mod:`rhnzoo.engine.task`: the contract, :class:`Task` (a task's pure steps, batches
  and report) and :class:`RunResult`.
* :mod:`rhnzoo.engine.loop`: :func:`run` and its one run class (the loop, checkpoints,
  exact resume, signals, divergence stop, metrics, validation, best checkpoints, the final
  evaluation); :mod:`rhnzoo.engine.seeds` each seed's records;
  :mod:`rhnzoo.engine.compiled` the jit-compiled step.
* :mod:`rhnzoo.engine.evaluate`: the package's one evaluation loop over an ``eval_step``
  (one seed or K stacked) and the reporting record, :class:`~rhnzoo.engine.evaluate.Report`.
* :mod:`rhnzoo.engine.progress`: what a run reports as it goes (loss book and
  divergence check, pace and estimates, printed lines).
* :mod:`rhnzoo.engine.workdir`: a run's directory: config check, checkpoints, metrics
  log, strict JSON.
* :mod:`rhnzoo.engine.stacking`: the seeds' layout, one seed (the identity) or K stacked
  as one program, chosen once.
* :mod:`rhnzoo.engine.sharding`: data parallelism over ``Mesh(("data",))``.
* :mod:`rhnzoo.engine.signals`: SIGTERM / SIGINT as a clean stop.
* :mod:`rhnzoo.engine.step`: the one train step (gradient, optimizer update).

The package hands on the engine's own API (:func:`run`, :class:`Task`,
:class:`RunResult`, :class:`TrainingDiverged`); a run's directory and the signals are
used from their modules (``from rhnzoo.engine import workdir, signals``).
"""

from rhnzoo.engine.loop import run  # noqa: F401
from rhnzoo.engine.task import RunResult, Task  # noqa: F401
from rhnzoo.engine.progress import TrainingDiverged  # noqa: F401
