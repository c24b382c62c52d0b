"""The JSB Chorales optimisation study of Zilly et al. (2017, sec. 5.1, Fig. 4; settings
and the study: :mod:`rhnzoo.configs.jsb`): each trial one run of
:func:`rhnzoo.tasks.polyphonic.train_and_evaluate`, in memory, on the multi-run runner;
:func:`study` trains them and returns their rows, :func:`study_table` lays them out.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from rhnzoo import cells
from rhnzoo.config import strict
from rhnzoo.configs import jsb as jsb_configs
from rhnzoo.configs.jsb import JSBConfig, TrialConfig
from rhnzoo.engine import workdir as workdir_lib
from rhnzoo.models import num_params
from rhnzoo.studies import sweep, tables
from rhnzoo.tasks import polyphonic
from rhnzoo.tasks.polyphonic import TrainResult

# Random search (one draw per trial index, shared by every architecture and depth, so the
# comparison is paired): learning rate log-uniform in [10^-2.5, 10^0]; momentum 0 (plain
# SGD) with probability 1/2, else 1 - 10^U(-2, -1); global-norm clip log-uniform in
# [1, 100]; uniform init half-width log-uniform in [0.01, 0.3]; RHN T bias U[-4, 0].
SEARCH_SPACE = {
    "log10_lr": (-2.5, 0.0),
    "p_momentum": 0.5,
    "log10_one_minus_momentum": (-2.0, -1.0),
    "log10_max_grad_norm": (0.0, 2.0),
    "log10_init_scale": (-2.0, math.log10(0.3)),
    "init_bias": (-4.0, 0.0),
}


def sample_hparams(seed: int, trial: int) -> dict:
    """The hyperparameters of trial ``trial``: a function of (seed, trial) only."""
    rng = np.random.default_rng([seed, trial])
    s = SEARCH_SPACE
    plain = rng.uniform() < s["p_momentum"]
    one_minus = 10 ** rng.uniform(*s["log10_one_minus_momentum"])
    return {
        "lr": float(10 ** rng.uniform(*s["log10_lr"])),
        "momentum": 0.0 if plain else float(1.0 - one_minus),
        "max_grad_norm": float(10 ** rng.uniform(*s["log10_max_grad_norm"])),
        "init_scale": float(10 ** rng.uniform(*s["log10_init_scale"])),
        "init_bias": float(rng.uniform(*s["init_bias"])),
    }


@functools.cache  # plan() asks again for the same widths (abstract shapes: no FLOPs)
def count(arch: str, n: int, depth: int) -> int:
    """Parameters of the whole model (cell + 88-way output layer)."""
    return num_params(jsb_configs.study_model(arch, n, depth))


def matched_width(arch: str, depth: int, target: int) -> int:
    """Width n >= 1 whose model parameter count is closest to ``target`` (counts grow with n)."""
    lo, hi = 1, 1
    while count(arch, hi, depth) < target:
        hi *= 2
    while lo < hi:  # smallest n with count >= target
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if count(arch, mid, depth) < target else (lo, mid)
    below = max(lo - 1, 1)
    return min((below, lo), key=lambda n: (abs(count(arch, n, depth) - target), n))


def plan(archs, depths, width) -> dict:
    """{(arch, depth): dict(hidden, params, target)}: the target count at depth L is that
    of an RHN of ``width``; the RHN gets ``width``, the others the closest count."""
    out = {}
    for depth in depths:
        target = count("rhn", width, depth)
        for arch in archs:
            n = width if arch == "rhn" else matched_width(arch, depth, target)
            out[arch, depth] = {"hidden": n, "params": count(arch, n, depth), "target": target}
    return out


def plan_lines(sizes: dict, width: int) -> list[str]:
    """The lines saying :func:`plan`'s ``sizes``: per (arch, depth) its width and count."""
    lines = [f"parameter counts (target: RHN of width {width} at each depth):"]
    for (arch, depth), s in sizes.items():
        lines.append(
            f"  {cells.label(arch):>9} depth {depth}: hidden {s['hidden']:4d}, "
            f"{s['params']:8,d} params (target {s['target']:,}, "
            f"{100 * (s['params'] / s['target'] - 1):+.2f}%)"
        )
    return lines


def trial_configs(config: JSBConfig, sizes: dict) -> list[TrialConfig]:
    """Every trial of the study, trials outermost (a study cut short has every (arch,
    depth) with some trials); ``sizes``: :func:`plan`'s. Each takes the study's shared
    settings, ``progress`` off."""
    shared = {**config.shared(), "progress": False}
    out = []
    for trial in range(config.trials):
        hp = sample_hparams(config.seed, trial)
        for depth in config.depths:
            for arch in config.archs:
                s = sizes[arch, depth]
                out.append(
                    TrialConfig(
                        arch=arch,
                        depth=depth,
                        trial=trial,
                        hidden=s["hidden"],
                        params=s["params"],
                        **hp,
                        **shared,
                    )
                )
    return out


def run_trial(trial: TrialConfig, data: dict, *, on_divergence: str = "stop") -> TrainResult:
    """Trains one trial in memory, silently
    (:func:`rhnzoo.tasks.polyphonic.train_and_evaluate`): its key is
    ``fold_in(PRNGKey(seed), trial)``, the batch order's seed an integer drawn from it,
    its initial parameters those of ``fold_in(key, 1)`` under its init settings."""
    model = jsb_configs.study_model(
        trial.arch, trial.hidden, trial.depth, scan_impl=trial.scan_impl
    )
    init_model = jsb_configs.study_model(
        trial.arch,
        trial.hidden,
        trial.depth,
        init_scale=trial.init_scale,
        init_bias=trial.init_bias,
    )
    key = jax.random.fold_in(jax.random.PRNGKey(trial.seed), trial.trial)
    seed = int(jax.random.randint(key, (), 0, 2**31 - 1))
    return polyphonic.train_and_evaluate(
        trial.replace(seed=seed),
        data,
        model=model,
        params=init_model.init(jax.random.fold_in(key, 1)),
        on_divergence=on_divergence,
    )


@dataclasses.dataclass(eq=False)
class _Progress:
    """The study's trial lines, ``[done/total]`` counted from the trials' workdirs; with
    ``estimate`` (a study in this process), the time the trials left take."""

    trials_dir: pathlib.Path
    names: tuple[str, ...]
    start: float
    log: Callable[[str], None]
    estimate: Any = None

    def finished(self) -> int:
        """The trials with a ``results.json``."""
        return sum((self.trials_dir / name / "results.json").is_file() for name in self.names)

    def report(self, t: TrialConfig, r: TrainResult) -> None:
        """One line for trial ``t`` just finished (its results.json not yet written)."""
        bias = f" bias {t.init_bias:.2f}" if "init_bias" in cells.options(t.arch) else ""
        left = "" if self.estimate is None else self.estimate.done(t.name, r.seconds)
        left = left.replace(" runs left", " trials left").replace(" run left", " trial left")
        self.log(
            f"[{self.finished() + 1:4d}/{len(self.names)}] {cells.label(t.arch):>9} "
            f"d{t.depth} t{t.trial}: lr {t.lr:.3g} mom {t.momentum:.3f} clip "
            f"{t.max_grad_norm:.3g} scale {t.init_scale:.3g}{bias} -> valid "
            f"{r.best_valid:.3f} test {r.test_at_best:.3f} (epoch {r.best_epoch}"
            f"{', diverged' if r.diverged else ''}) {r.seconds:.1f} s | "
            f"{time.perf_counter() - self.start:.0f} s{left}"
        )


def _study_trial(trial: TrialConfig, data: dict, progress: _Progress, on_divergence: str) -> dict:
    """A study run's ``compute`` (:func:`rhnzoo.studies.sweep.in_memory`)."""
    r = run_trial(trial, data, on_divergence=on_divergence)
    progress.report(trial, r)
    return {
        "valid_nll": r.best_valid,
        "test_nll": r.test_at_best,
        "best_epoch": r.best_epoch,
        "epochs_run": r.epochs_run,
        "diverged": r.diverged,
        "seconds": round(r.seconds, 2),
    }


def _study_run(trial: TrialConfig, data: dict, progress: _Progress) -> sweep.Run:
    """The runner's :class:`~rhnzoo.studies.sweep.Run` of a trial (trained in memory)."""
    compute = functools.partial(_study_trial, trial, data, progress)
    return sweep.Run(trial.name, trial, sweep.in_memory(compute, trial))


def study(
    data: dict,
    root,
    config: JSBConfig,
    *,
    log: Callable[[str], None] = print,
    jobs: sweep.Jobs | None = None,
) -> list[dict]:
    """The JSB random search on the multi-run runner.

    ``root`` holds the study's ``config.json`` (a rerun in it is refused when a structural
    setting differs) and one workdir per trial, ``root/trials/<arch>_d<depth>_t<trial>``,
    with its config.json and results.json. Trials train in memory (no checkpoints): a
    finished trial is not run again, a rerun with more trials (archs, depths) trains the
    new ones only. A trial that diverges stops there. ``jobs``: trials side by side in
    child processes (one that fails there is left out of the rows). ``log`` gets the
    planned sizes, one line per trial and the runner's lines.

    Returns:
      Every finished trial's row, its config and results (also ``root/results.jsonl``);
      a non-finite NLL is inf.
    Raises:
      ValueError: (one line) ``root`` holds a study with other structural settings, or
        cannot be written; what :func:`check_study` refuses (nothing written then).
    """
    sizes = plan(config.archs, config.depths, config.width)
    trials = trial_configs(config, sizes)
    names = tuple(t.name for t in trials)
    check_study(config, data, names, jobs)  # before the root's config.json is written
    root = workdir_lib.prepare_workdir(root, config, log=log)
    for line in plan_lines(sizes, config.width):
        log(line)
    progress = _Progress(root / "trials", names, time.perf_counter(), log)
    runs = [_study_run(t, data, progress) for t in trials]
    finished = progress.finished()
    if finished:
        log(f"{finished} of {len(runs)} trials already finished")
    parallel = jobs is not None and jobs.n > 1
    if not parallel and (jobs is None or jobs.only is None):  # the runner's lines say it
        progress.estimate = sweep.Estimate(runs, root / "trials")
    sweep.run_all(runs, root / "trials", log=log if parallel else None, jobs=jobs)
    done = sweep.collect(root / "trials", progress.names)
    rows = [_finite({**d["config"], **d["results"]}) for d in done.values() if d and d["results"]]
    with open(root / "results.jsonl", "w") as f:
        f.writelines(json.dumps(strict(row)) + "\n" for row in rows)
    return rows


def check_study(
    config: JSBConfig, data: dict, names: tuple[str, ...], jobs: sweep.Jobs | None
) -> None:
    """Refuses, before :func:`study` writes anything, a ``--batch_size`` above the
    training set's number of sequences (every batch is padded to ``batch_size`` rows)
    and a ``--sweep_run`` (``jobs.only``) that is none of the trials ``names``.

    Raises:
      ValueError: (one line naming the flag) for either.
    """
    n = len(data["train"])
    if config.batch_size > n:
        raise ValueError(
            f"--batch_size must be at most {n}, the training set's sequences, "
            f"got {config.batch_size}"
        )
    if jobs is not None and jobs.only is not None and jobs.only not in names:
        raise ValueError(f"--sweep_run={jobs.only} is not a run of this sweep ({', '.join(names)})")


def _finite(row: dict) -> dict:
    """Strict JSON stores a non-finite NLL as null: back to inf."""
    return {
        **row,
        **{k: math.inf if row.get(k) is None else row[k] for k in ("valid_nll", "test_nll")},
    }


def study_table(rows: list[dict], config: JSBConfig, sizes: dict) -> str:
    """Markdown table (:func:`rhnzoo.studies.tables.markdown`): per (arch, depth) the test
    NLL of the best-validation trial and the median over trials (failed trials count as
    +inf)."""
    header = [
        "architecture",
        "depth",
        "hidden",
        "params",
        "target",
        "trials",
        "failed",
        "test NLL (best valid trial)",
        "median test NLL",
        "best valid NLL",
    ]
    table = []
    for depth in config.depths:
        for arch in config.archs:
            mine = [r for r in rows if r["arch"] == arch and r["depth"] == depth]
            tests = [r["test_nll"] if math.isfinite(r["valid_nll"]) else math.inf for r in mine]
            best = min(mine, key=lambda r: r["valid_nll"]) if mine else None
            s = sizes[arch, depth]
            table.append(
                [
                    cells.label(arch),
                    depth,
                    s["hidden"],
                    f"{s['params']:,}",
                    f"{s['target']:,}",
                    len(mine),
                    sum(not math.isfinite(t) for t in tests),
                    _nll(best["test_nll"]) if best else None,
                    _nll(float(np.median(tests))) if tests else None,
                    _nll(best["valid_nll"]) if best else None,
                ]
            )
    return tables.markdown(header, table, blank="-")


def _nll(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) else "inf"
