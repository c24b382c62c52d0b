"""The run engine: one training loop for every task, below the tasks (docs/engine.md).

Its modules: ``task`` the contract (:class:`Task`, :class:`RunResult`); ``loop``
:func:`run`, with ``seeds`` (each seed's records), ``compiled`` (the jit-compiled step)
and ``step`` (the one train step); ``evaluate`` the package's one evaluation loop and the
reporting record; ``progress`` what a run reports as it goes; ``workdir`` a run's
directory; ``stacking`` the seeds' layout (one, or K stacked); ``sharding`` data
parallelism; ``signals`` SIGTERM / SIGINT as a clean stop.

The package hands on the engine's own API (:func:`run`, :class:`Task`,
:class:`RunResult`, :class:`TrainingDiverged`); a run's directory and the signals are
used from their modules (``from rhnzoo.engine import workdir, signals``).
"""

from rhnzoo.engine.loop import run  # noqa: F401
from rhnzoo.engine.task import RunResult, Task  # noqa: F401
from rhnzoo.engine.progress import TrainingDiverged  # noqa: F401
