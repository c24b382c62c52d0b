"""The multi-run runner's flags (:mod:`rhnzoo.studies.sweep`): ``--jobs``, ``--seeds`` and
``--sweep_run`` (a child's), the same in every multi-run script."""

from __future__ import annotations

import os
import sys

from absl import flags

from rhnzoo.config import SEED_HIGH
from rhnzoo.studies.sweep import LOG, MEMORY_SHARE, Jobs, stop_with_parent


def define_flags(*, seeds: bool = True) -> None:
    """``--jobs``, ``--sweep_run`` (a child's) and, with ``seeds``, ``--seeds``; call once,
    at import of a sweep's script; :func:`from_flags` reads them."""
    flags.DEFINE_integer(
        "jobs",
        1,
        "Runs at a time: 1 trains them one after another in this process; N > 1 runs each "
        "as a child process (this command with --sweep_run=<run>), N side by side, each with "
        f"its share of the CPU cores and {MEMORY_SHARE:g}/N of an accelerator's memory "
        f"(XLA_PYTHON_CLIENT_MEM_FRACTION, unless set); a child's output goes to <workdir>/{LOG}.",
    )
    flags.DEFINE_string(
        "sweep_run", None, "Train this run of the sweep alone (what the children of --jobs do)."
    )
    if seeds:
        flags.DEFINE_integer(
            "seeds",
            1,
            "Runs per row, with seeds --seed, --seed+1, ... (initialisation, dropout, data "
            "order; the dev split stays fixed), in <run>, <run>_s1, ...; tables show mean ± sd "
            "(n).",
        )
        flags.DEFINE_boolean(
            "stack_seeds",
            False,
            "Train a row's --seeds as one program: their states stacked, one vmapped step for "
            "all (on an accelerator K seeds cost far less than K runs); the same workdirs and "
            "records; with --jobs, each child trains a row's seeds.",
        )


def from_flags() -> tuple[Jobs, int]:
    """``(Jobs, seeds)`` of ``--jobs``, ``--sweep_run``, ``--stack_seeds`` and ``--seeds``
    (1 where the script has no ``--seeds``); the command line is ``sys.argv``.

    With ``--jobs`` > 1 this process only starts children and waits, so it keeps JAX from
    preallocating an accelerator's memory here (``XLA_PYTHON_CLIENT_PREALLOCATE=false`` for
    this process, unless set; call this before JAX touches a device). Children run with
    ``--noprogress`` where the script has it.

    Raises:
      ValueError: ``--seeds`` < 1, ``--stack_seeds`` with one seed, a last seed
        (``--seed`` + ``--seeds`` - 1) past :data:`rhnzoo.config.SEED_HIGH` (one line).
    """
    F = flags.FLAGS
    seeds = F.seeds if "seeds" in F else 1
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    if "stack_seeds" in F and F.stack_seeds and seeds == 1:
        raise ValueError("--stack_seeds stacks a row's --seeds: it needs --seeds > 1")
    if seeds > 1 and "seed" in F and F.seed + seeds - 1 > SEED_HIGH:  # one: the config's check
        raise ValueError(
            f"--seed={F.seed} with --seeds={seeds}: the last seed, "
            f"{F.seed + seeds - 1}, must be <= {SEED_HIGH}"
        )
    stack = seeds > 1 and F.stack_seeds
    if F.sweep_run is not None:
        stop_with_parent()
        return Jobs(only=F.sweep_run, stack_seeds=stack), seeds
    if F.jobs <= 1:
        return Jobs(F.jobs, stack_seeds=stack), seeds
    env = dict(os.environ)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    quiet = ["--noprogress"] if "progress" in F else []
    command = [sys.executable, sys.argv[0], *quiet, *sys.argv[1:]]
    return Jobs(F.jobs, command, env=env, stack_seeds=stack), seeds
