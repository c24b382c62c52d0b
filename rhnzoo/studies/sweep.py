"""The one multi-run runner: named configurations, one workdir each (docs/engine.md, "The
multi-run runner", "--jobs / --seeds", "Estimates").

A sweep is a list of :class:`Run`; :func:`run_all` checks every existing workdir before
any training, then trains the runs in this process or, :class:`Jobs`, N at a time in
child processes (each the sweep's own command with ``--sweep_run=<name>``, so a child does
exactly what the same run does in-process; its output in ``<workdir>/sweep.log``, a
failure in ``<workdir>/failed.json``). :class:`Estimate` says the time the runs left take;
:func:`seed_runs` makes a sweep's runs from its rows of seeds; :func:`collect` reads the
workdirs back. Tables: :mod:`rhnzoo.studies.tables`; flags: :mod:`rhnzoo.apps.runner`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rhnzoo.config import Config
from rhnzoo.engine import progress, signals, stacking
from rhnzoo.engine import workdir as workdir_lib
from rhnzoo.engine.stacking import seed_name

PathLike = str | pathlib.Path
LOG = "sweep.log"  # a child's stdout and stderr, in its workdir
FAILED = "failed.json"  # a run whose child ended without results (--jobs > 1)
MEMORY_SHARE = 0.9  # of an accelerator's memory, split between the children


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a sweep.

    Attributes:
      name: the workdir's name under the sweep's root (a path component, no ``/``).
      config: the run's settings (``config.json`` is ``config.to_dict()``).
      train: ``train(workdir, on_divergence) -> results`` (``results.json``'s content);
        ``on_divergence`` is the runner's policy, passed on to
        :func:`rhnzoo.engine.run`.
      size: the run's cost relative to the sweep's other runs (e.g. its steps x its
        parameters), for the runner's estimate of the time left; the default, 1 for
        every run, counts the runs as the same size.
      seeds: K > 1: the run is K seeds of ``config`` trained as one program (``train``
        passes ``seeds=K`` to :func:`rhnzoo.engine.run`), seed k in :func:`seed_name`
        with :func:`rhnzoo.engine.stacking.seed_config`; ``train`` returns the first
        seed's results.
    """

    name: str
    config: Config
    train: Callable[[pathlib.Path, str], Mapping[str, Any] | None]
    size: float = 1.0
    seeds: int = 1

    def __post_init__(self):
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ValueError(f"run name must be one path component, got {self.name!r}")


@dataclasses.dataclass(frozen=True)
class Jobs:
    """How :func:`run_all` trains the runs (from the flags: :func:`rhnzoo.apps.runner.from_flags`).

    Attributes:
      n: runs at a time (>= 1). 1: one after another in this process; n > 1: each in
        a child process, ``n`` side by side.
      command: with n > 1, the sweep's own command line ``[python, script, *flags]``;
        run ``name``'s child is :meth:`child_command`.
      only: set in a child: :func:`run_all` trains this run alone, then ends the
        process (``SystemExit(0)``; the sweep's tables are the parent's).
      env: the children's environment (None: this process's).
      stack_seeds: a sweep's seeds of one row train as one run of :attr:`Run.seeds`
        (the scripts' ``--stack_seeds``); the sweep builds its runs so.

    Raises:
      ValueError: ``n < 1``, or n > 1 without a command.
    """

    n: int = 1
    command: Sequence[str] = ()
    only: str | None = None
    env: Mapping[str, str] | None = None
    stack_seeds: bool = False

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"--jobs must be >= 1, got {self.n}")
        if self.n > 1 and self.only is None and len(self.command) < 2:
            raise ValueError("jobs > 1 needs the sweep's command line")

    @property
    def here(self) -> bool:
        """Whether :func:`run_all` trains the runs one after another in this process."""
        return self.n == 1 and self.only is None

    def child_command(self, name: str) -> list[str]:
        """The command that trains run ``name`` alone: ``command`` with
        ``--sweep_run=<name>`` after the script."""
        return [*self.command[:2], f"--sweep_run={name}", *self.command[2:]]


def seed_runs(
    rows: Sequence[tuple[str, Config]],
    seeds: int,
    train: Callable[[Config, int | None], Callable[[pathlib.Path, str], Any]],
    *,
    stack: bool = False,
    size: Callable[[Config], float] = lambda config: 1.0,
) -> list[Run]:
    """The :class:`Run` s of a sweep whose every row trains ``seeds`` seeds.

    Args:
      rows: ``[(name, config)]``, each row's seeds in turn: seed k of the row whose first
        entry is ``(name, config)`` is entry ``i * seeds + k``, named
        :func:`seed_name` ``(name, k)`` (its config seed k's own).
      seeds: seeds per row (>= 1).
      train: ``(config, K) -> Run.train``: ``K`` None for one seed, else the K seeds of
        ``config`` trained as one program (:attr:`Run.seeds`).
      stack: one run per row of its seeds stacked (the first seed's name and config),
        else one run per entry.
      size: :attr:`Run.size` from a config.

    Raises:
      ValueError: ``rows`` not whole rows in that order (one line).
    """
    if seeds < 1 or len(rows) % seeds:
        raise ValueError(f"{len(rows)} runs are not rows of {seeds} seeds")
    for i, (name, _) in enumerate(rows):
        first, k = rows[i - i % seeds][0], i % seeds
        if name != seed_name(first, k):
            raise ValueError(
                f"run {i} is {name!r}, not seed {k} of {first!r} ({seeds} seeds per row, in turn)"
            )
    k = seeds if stack and seeds > 1 else 1
    return [
        Run(name, config, train(config, None if k == 1 else k), size=size(config), seeds=k)
        for name, config in rows[::k]
    ]


def check_root(root: PathLike) -> None:
    """Refuses (ValueError, one line) a sweep's root that holds a ``config.json`` (a single
    run's workdir or a study's root, where this sweep's workdirs would be written beside
    another run's records), and a root that exists and is no directory (a file)."""
    root = pathlib.Path(root)
    if root.exists() and not root.is_dir():
        raise ValueError(f"{root} exists and is not a directory; give a folder for the workdirs")
    if (root / "config.json").is_file():
        held = sorted(p.name + ("/" if p.is_dir() else "") for p in root.iterdir())
        shown = ", ".join(n for n in held if not n.startswith("."))
        raise ValueError(
            f"{root} is a run's workdir or a study's root (it holds {shown}), not a folder "
            "of this experiment's workdirs; use another one"
        )


def run_all(
    runs: Sequence[Run],
    root: PathLike,
    *,
    log: Callable[[str], None] | None = print,
    jobs: Jobs | None = None,
    on_divergence: str = "stop",
    quiet: bool = False,
) -> dict[str, Mapping[str, Any] | None]:
    """Trains ``runs``, each in ``root/<name>``: one after another in this process, or
    side by side in child processes (``jobs``, see :class:`Jobs`).

    The runner owns the divergence policy: with ``on_divergence='stop'`` (a sweep) a run
    that diverges ends there, its best parameters evaluated and ``results['diverged']``
    set, and the others go on; ``'raise'`` (a script's single run) raises
    :class:`~rhnzoo.engine.TrainingDiverged`. ``log`` gets ``[i/n]`` before each run and,
    with several, ``[i/n] <name> done in X min`` and the estimated time left after each.

    Args:
      quiet: the runs trained in this process log to their ``sweep.log``
        (:func:`run_log`), as a child's do; the runner's lines show each one's final line.

    Returns:
      ``{name: results}`` in the order of ``runs`` (with ``jobs.n > 1``: None for a run
      that failed; its ``failed.json`` says why).

    Raises:
      ValueError: duplicate names, a root that is a run's or a study's workdir
        (:func:`check_root`), or an existing workdir holding other settings (checked
        for every run before the first one trains); ``jobs.only`` not a run.
      Whatever a run's ``train`` raises in this process (``Interrupted`` on a signal,
        ...); with ``jobs.n > 1``, ``Interrupted`` once every child has stopped.
      SystemExit: in a child (``jobs.only``), status 0 after its run.
    """
    if on_divergence not in ("stop", "raise"):
        raise ValueError(f"on_divergence must be 'stop' or 'raise', got {on_divergence!r}")
    jobs = jobs or Jobs()
    root = pathlib.Path(root)
    check_root(root)
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate run names in {names}")
    if jobs.only is not None:
        runs = [r for r in runs if r.name == jobs.only]
        if not runs:
            raise ValueError(
                f"--sweep_run={jobs.only} is not a run of this sweep ({', '.join(names)})"
            )
    for r in runs:
        for k in range(r.seeds):
            workdir = root / seed_name(r.name, k)
            if (workdir / "config.json").is_file():
                config = stacking.seed_config(r.config, k, (root / r.name).absolute())
                workdir_lib.prepare_workdir(workdir, config, check_only=True)
    say = log or (lambda line: None)
    if jobs.only is not None:
        (root / jobs.only / FAILED).unlink(missing_ok=True)
        runs[0].train(root / jobs.only, on_divergence)
        raise SystemExit(0)
    if jobs.n > 1:
        return _run_children(runs, root, jobs, say)
    return _run_here(runs, root, on_divergence, say, quiet)


def _run_here(
    runs: Sequence[Run], root: pathlib.Path, on_divergence: str, say, quiet: bool
) -> dict:
    """:func:`run_all` in this process, one run after another."""
    out, estimate = {}, Estimate(runs, root)
    for i, r in enumerate(runs, 1):
        count = f"[{i}/{len(runs)}]"
        say(f"{count} {r.name} -> {root / r.name}" + (f" (its lines: {LOG})" if quiet else ""))
        (root / r.name / FAILED).unlink(missing_ok=True)
        started = progress.now()
        out[r.name] = r.train(root / r.name, on_divergence)
        seconds = progress.now() - started
        left = estimate.done(r.name, seconds)
        if quiet or len(runs) > 1:
            say(_done_line(count, r.name, seconds, out[r.name] if quiet else None, left))
    return out


def _done_line(count: str, name: str, seconds: float, results: Mapping | None, left: str) -> str:
    """``[i/n] <name> done in X min``, then ``: <its final line>`` (from ``results``) and
    ``left`` (:meth:`Estimate.done`)."""
    final = f": {results['final']}" if results and "final" in results else ""
    return f"{count} {name} done in {seconds / 60:.1f} min{final}{left}"


class Estimate:
    """The time the runs left take (docs/engine.md, "Estimates"): the seconds per unit of
    :attr:`Run.size` of the runs trained from the start in this sweep x the sizes of the
    runs left, less what the running ones have done, divided by the runs at a time (never
    less than the longest run left)."""

    def __init__(self, runs: Sequence[Run], root: pathlib.Path, at_a_time: int = 1):
        self.size = {r.name: float(r.size) for r in runs}
        self.left = [r.name for r in runs if not (root / r.name / "results.json").is_file()]
        self.fresh = {r.name for r in runs if not (root / r.name / "config.json").is_file()}
        self.at_a_time, self.seconds, self.units = at_a_time, 0.0, 0.0

    def done(
        self,
        name: str,
        seconds: float,
        measured: bool = True,
        running: Mapping[str, float] | None = None,
    ) -> str:
        """Run ``name`` ended after ``seconds`` (``measured``: it trained to its end);
        ``running``: the runs still training, with their seconds so far. Returns
        ``'; about 15 min for the 7 runs left'`` (``''`` when none is left, or no run has
        been timed)."""
        if name in self.left:
            self.left.remove(name)
        if measured and name in self.fresh:
            self.seconds, self.units = self.seconds + seconds, self.units + self.size[name]
        if not self.left or not self.units:
            return ""
        rate, running = self.seconds / self.units, running or {}
        each = [max(rate * self.size[n] - running.get(n, 0.0), 0.0) for n in self.left]
        total = max(sum(each) / self.at_a_time, max(each))
        runs = f"{len(self.left)} run{'s' if len(self.left) != 1 else ''}"
        side = f", {self.at_a_time} at a time" if self.at_a_time > 1 else ""
        return f"; about {progress.duration(total)} for the {runs} left{side}"


def run_log(workdir: PathLike) -> Callable[[str], None]:
    """A run's ``log`` for ``run_all(quiet=True)``: each line appended to
    ``<workdir>/sweep.log``, after a header line."""
    path = pathlib.Path(workdir) / LOG
    path.parent.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        with open(path, "a") as f:
            f.write(line + "\n")

    log(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} in process {os.getpid()}")
    return log


def _run_children(runs: Sequence[Run], root: pathlib.Path, jobs: Jobs, say) -> dict:
    """:func:`run_all` with ``jobs.n`` child processes at a time."""
    env = dict(os.environ if jobs.env is None else jobs.env)
    # Each child gets its share of an accelerator's memory (JAX would otherwise take 75 %
    # in the first one) and of the CPU cores (XLA's CPU thread pool follows the process's
    # CPU affinity; the XLA_FLAGS thread settings are not honoured by jax 0.10's CPU client).
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{MEMORY_SHARE / jobs.n:.3f}")
    env.update(PYTHONUNBUFFERED="1", RHNZOO_SWEEP_PARENT=str(os.getpid()))
    say(f"{len(runs)} runs, {jobs.n} at a time in child processes (output: {root}/<run>/{LOG})")
    pending, running, out, done = list(runs), {}, {}, 0
    estimate = Estimate(runs, root, jobs.n)
    installed_here = not signals.installed()
    signals.catch_signals()
    stop = None
    try:
        while pending or running:
            if stop is None and signals.stop_requested() is not None:
                stop = signals.stop_requested()
                pending.clear()
                say(
                    f"signal {stop}: stopping {len(running)} running run(s); each saves "
                    "its checkpoint"
                )
                for child in running.values():
                    child.proc.send_signal(stop)
            while pending and len(running) < jobs.n:
                slot = min(set(range(jobs.n)) - {c.slot for c in running.values()})
                r = pending.pop(0)
                running[r.name] = _start(r.name, root, jobs, env, slot)
            for name, child in list(running.items()):
                if child.proc.poll() is None:
                    continue
                del running[name]
                done += 1
                out[name] = _finished(
                    name, root / name, child, stop, say, f"[{done}/{len(runs)}]", estimate, running
                )
            time.sleep(0.2)
    finally:
        for child in running.values():  # only after an error here: stop them and wait
            if stop is None:
                child.proc.send_signal(signal.SIGTERM)
            child.proc.wait()
        if installed_here:
            signals.release_signals()
    if stop is not None:
        raise signals.Interrupted(
            stop, f"stopped by signal {stop}; rerun the same command to resume"
        )
    failed = [name for name, results in out.items() if results is None]
    if failed:
        say(
            f"{len(failed)} of {len(runs)} runs failed: {', '.join(failed)} (see their "
            f"{FAILED} and {LOG})"
        )
    return {r.name: out.get(r.name) for r in runs}


@dataclasses.dataclass
class _Child:
    proc: subprocess.Popen
    slot: int
    start: float  # progress.now()
    log: pathlib.Path


def _start(name: str, root: pathlib.Path, jobs: Jobs, env: dict, slot: int) -> _Child:
    workdir = root / name
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / FAILED).unlink(missing_ok=True)
    path = workdir / LOG
    with open(path, "a") as f:
        f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(jobs.child_command(name))}\n")
        f.flush()
        # A session of its own: a Ctrl-C in the terminal reaches the parent alone, which
        # passes it on once (a second signal would end a child without saving).
        proc = subprocess.Popen(
            jobs.child_command(name),
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    if hasattr(os, "sched_setaffinity"):  # before the child has started JAX's thread pools
        try:
            os.sched_setaffinity(proc.pid, _cpu_share(slot, jobs.n))
        except OSError:
            pass
    return _Child(proc, slot, progress.now(), path)


def _cpu_share(slot: int, n: int) -> list[int]:
    """The CPU cores of child ``slot`` of ``n``: a disjoint share of this process's
    cores (one core each, round robin, when there are fewer cores than children)."""
    cores = sorted(os.sched_getaffinity(0))
    if n > len(cores):
        return [cores[slot % len(cores)]]
    return cores[slot * len(cores) // n : (slot + 1) * len(cores) // n]


def _finished(
    name,
    workdir: pathlib.Path,
    child: _Child,
    stop,
    say,
    count: str,
    estimate: Estimate,
    running: Mapping[str, _Child],
):
    """The results of a child that ended (None if it failed or was stopped) and its line
    (with ``estimate``'s time for the runs left; ``running``: the children still training)."""
    now = progress.now()
    code, minutes = child.proc.returncode, (now - child.start) / 60
    results = workdir / "results.json"
    ok = code == 0 and results.is_file()
    left = estimate.done(
        name, now - child.start, measured=ok, running={n: now - c.start for n, c in running.items()}
    )
    if ok:
        out = json.loads(results.read_text())
        say(_done_line(count, name, now - child.start, out, "" if stop is not None else left))
        return out
    if stop is not None and code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        say(f"{count} {name} stopped (its state saved; {child.log})")
        return None
    lines = [l for l in child.log.read_text(errors="replace").splitlines() if l.strip()]
    error = lines[-1].strip() if lines else ""
    why = f"exit status {code}" if code else "no results.json"
    workdir_lib.write_json(
        workdir / FAILED, {"exit_status": code, "error": error, "log": str(child.log)}
    )
    say(f"{count} {name} FAILED ({why}) in {minutes:.1f} min: {error} ({child.log})")
    return None


def stop_with_parent() -> None:
    """In a child of :func:`run_all`: one SIGTERM to itself when the parent has gone, so
    that a parent killed outright (SIGKILL) still leaves every child's state saved. (Not
    ``prctl(PR_SET_PDEATHSIG)``: that signals once per exiting thread of the parent, and
    a second signal ends a run without saving.)"""
    parent = os.environ.get("RHNZOO_SWEEP_PARENT")
    if parent is None:
        return

    def watch():
        while os.getppid() == int(parent):
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="rhnzoo-sweep-parent", daemon=True).start()


def in_memory(
    compute: Callable[[str], Mapping[str, Any]], config: Config
) -> Callable[[pathlib.Path, str], Mapping[str, Any]]:
    """A :attr:`Run.train` for a run that keeps nothing but its results (trained in memory):
    a workdir's ``results.json`` if it has one, else ``compute(on_divergence)``, then
    ``config.json`` and ``results.json`` written (a run killed midway runs again)."""

    def train(workdir: pathlib.Path, on_divergence: str) -> Mapping[str, Any]:
        path = pathlib.Path(workdir) / "results.json"
        if path.is_file():
            return json.loads(path.read_text())
        results = compute(on_divergence)
        workdir_lib.prepare_workdir(workdir, config)
        workdir_lib.write_json(path, results)
        return results

    return train


def collect(root: PathLike, names: Sequence[str]) -> dict[str, dict[str, Any] | None]:
    """What the workdirs ``root/<name>`` hold: ``{name: {'config', 'results', 'history',
    'failed'}}`` (``results`` None while unfinished; ``failed`` the ``failed.json`` of a
    run that failed in a child process, else None; ``config`` None if it failed before
    writing one); None for a workdir with neither ``config.json`` nor ``failed.json``.

    Raises:
      ValueError: one of those files, or ``metrics.jsonl``, is unreadable (one line
        naming it)."""
    root = pathlib.Path(root)
    out = {}
    for name in names:
        wd = root / name
        config, results, failed = wd / "config.json", wd / "results.json", wd / FAILED
        if not config.is_file() and not failed.is_file():
            out[name] = None
            continue
        out[name] = {
            "config": workdir_lib.read_config(wd) if config.is_file() else None,
            "results": workdir_lib.read_json(results),
            "history": workdir_lib.read_metrics(wd) if config.is_file() else [],
            "failed": None if results.is_file() else workdir_lib.read_json(failed),
        }
    return out
