"""Table 3 of Wang & Tian (EMNLP 2016): the paper's test accuracies, the runs that
reproduce them (one :func:`rhnzoo.tasks.rrl.train_and_evaluate` per model and seed, on
the multi-run runner :mod:`rhnzoo.studies.sweep`) and the table that sets ours beside
them; also the recipe studies' runs and table (:data:`rhnzoo.configs.rrl.STUDIES`).
:func:`run_experiment` is ``experiments/rrl.py``'s study.
"""

from __future__ import annotations

import functools
import math
import pathlib
from collections.abc import Callable, Mapping, Sequence

from rhnzoo import cells
from rhnzoo.configs.rrl import RRLConfig
from rhnzoo.data.sequences import Dataset
from rhnzoo.engine.stacking import seed_name
from rhnzoo.studies import sweep, tables
from rhnzoo.tasks import rrl

# Wang & Tian 2016, Table 3 (test accuracy, %), ../shared/papers/004_b303ba294415a388.txt.
PAPER_TABLE3: dict[tuple[str, str], float] = {
    (model, dataset): acc
    for model, row in {
        "lstm": (91.76, 88.88, 79.21, 90.64),
        "rrn": (91.19, 89.13, 79.76, 88.63),
        "sc_lstm_p": (92.01, 90.74, 82.98, 94.46),
        "sc_lstm_i": (92.05, 90.67, 81.85, 94.80),
        "lstm_gru": (91.05, 89.23, 80.12, 90.28),
        "hrl": (91.90, 90.92, 81.73, 90.33),
    }.items()
    for dataset, acc in zip(("agnews", "imdb", "20ng", "pmnist"), row)
}


def _train(
    config: RRLConfig,
    load: Callable[[], Dataset],
    log,
    workdir,
    on_divergence: str,
    seeds: int | None = None,
) -> dict:
    """A sweep run's ``train`` (the first three arguments and ``seeds`` bound):
    :func:`rhnzoo.tasks.rrl.train_and_evaluate` on ``load()`` (``seeds``: K stacked, the
    first one's results)."""
    out = rrl.train_and_evaluate(
        config, load(), workdir, on_divergence=on_divergence, log=log, seeds=seeds
    )
    return out.results if seeds is None else out[0].results


# ------------------------------------------------------------------------ tables


def _measured(runs: Sequence[dict | None]) -> list:
    """``[best dev acc %, test acc % (or 'diverged' / 'failed'), epochs, minutes]`` of a
    row's runs, one per seed: mean ± sd over the seeds measured, the test cell naming the
    seeds that diverged or failed, epochs and minutes the mean per seed; an unfinished
    run is marked in the dev cell (:func:`_unfinished`). None where nothing is measured."""
    devs, tests, epochs, minutes, notes, unfinished = [], [], [], [], [], []
    started = any(run is not None for run in runs)
    for run in runs:
        r, hist = (run or {}).get("results"), (run or {}).get("history") or []
        if started and r is None and not (run or {}).get("failed"):
            unfinished.append(_progress(run))
        best = max((h.get("dev_acc", math.nan) for h in hist), default=None)
        best = r["dev_acc"] if r and "dev_acc" in r else best
        if best is not None:
            devs.append(100 * best)
        if r and r.get("diverged"):
            notes.append("diverged")
        elif r and "test_acc" in r:
            tests.append(100 * r["test_acc"])
        elif (run or {}).get("failed"):
            notes.append("failed")
        if hist:
            epochs.append(len(hist))
            minutes.append(hist[-1]["elapsed_s"] / 60)
    test = tables.mean_sd(tests)
    if notes:
        counts = {n: notes.count(n) for n in dict.fromkeys(notes)}
        said = ", ".join(n if len(runs) == 1 else f"{k} {n}" for n, k in counts.items())
        test = said if test is None else f"{test}; {said}"
    dev = _unfinished(tables.mean_sd(devs), unfinished, len(runs))
    return [dev, test, _mean(epochs, ".0f"), _mean(minutes, ".1f")]


def _progress(run: dict | None) -> str:
    """``'epoch <e> of <epochs>'``, how far an unfinished run got; ``'not started'`` for
    None."""
    if run is None:
        return "not started"
    hist, config = run.get("history") or [], run.get("config") or {}
    total = f" of {config['epochs']}" if "epochs" in config else ""
    return f"epoch {hist[-1]['epoch'] if hist else 0}{total}"


def _unfinished(dev: str | None, progress: Sequence[str], n: int) -> str | None:
    """The dev cell ``dev`` of ``n`` runs marked with its unfinished ones' ``progress``:
    ``'79.33 (epoch 1 of 10, unfinished)'``, for seeds ``'... (1 of 2 unfinished: ...)'``."""
    if not progress:
        return dev
    note = (
        f"({progress[0]}, unfinished)"
        if n == 1
        else f"({len(progress)} of {n} unfinished: {'; '.join(progress)})"
    )
    return note if dev is None else f"{dev} {note}"


def _mean(values: Sequence[float], spec: str) -> str | None:
    """The mean of ``values`` formatted with ``spec``; None for none."""
    return f"{math.fsum(values) / len(values):{spec}}" if values else None


def table_text(root, models: Sequence[str], dataset: str, title: str, seeds: int = 1) -> str:
    """Table 3's layout from the workdirs ``root/<model>`` (seed k > 0:
    ``<model>_s<k>``): the paper's test accuracy beside our dev and test accuracy (several
    seeds: mean ± sd), parameters, epochs and minutes (a run not yet finished: its best
    dev accuracy so far, marked ``(epoch e of N, unfinished)``, and no test accuracy).

    Raises:
      ValueError: a workdir's JSON file is unreadable (one line naming it)."""
    rows = []
    for name in models:
        runs = list(sweep.collect(root, [seed_name(name, k) for k in range(seeds)]).values())
        paper = PAPER_TABLE3.get((name, dataset))
        r = next((run["results"] for run in runs if run and run["results"]), None) or {}
        params = f"{r['parameters']:,}" if "parameters" in r else None
        dev, test, epochs, minutes = _measured(runs)
        rows.append(
            [
                cells.label(name),
                "n/a" if paper is None else f"{paper:.2f}",
                dev,
                test,
                params,
                epochs,
                minutes,
            ]
        )
    header = [
        f"model ({title})",
        "paper test acc (Table 3)",
        "rhnzoo dev acc",
        "rhnzoo test acc",
        "parameters",
        "epochs",
        "minutes",
    ]
    return tables.markdown(header, rows)


def study_table(root, names: Sequence[str], title: str, seeds: int = 1) -> str:
    """The recipe study's table: setting, dev accuracy (best epoch), test accuracy,
    epochs, minutes (several seeds: mean ± sd; unfinished runs marked as in
    :func:`table_text`). Raises ValueError as :func:`table_text`."""
    rows = [
        [
            name,
            *_measured(
                list(sweep.collect(root, [seed_name(name, k) for k in range(seeds)]).values())
            ),
        ]
        for name in names
    ]
    return tables.markdown(
        [f"setting ({title})", "best dev acc", "test acc (best dev)", "epochs", "minutes"], rows
    )


# ------------------------------------------------------------------- the experiment


def run_experiment(
    configs: Mapping[str, RRLConfig],
    root,
    *,
    study: str | None,
    table: bool,
    run_missing: bool,
    load: Callable[[], Dataset],
    title: str,
    log: Callable[[str], None] | None = print,
    seeds: int = 1,
    jobs=None,
) -> str | None:
    """What ``experiments/rrl.py`` does: one model, the ``--table`` models, or a study.

    ``configs`` holds every run (name -> config: :func:`rhnzoo.configs.rrl.runs`);
    ``load()`` loads the data set, once, when a run trains. A model trains in ``root/<model>``, a
    study's setting in ``root/study_<study>/<setting>``; seed k > 0 of either in
    ``<name>_s<k>`` with seed ``config.seed + k``. With several runs a diverging one is
    recorded and the others go on. Returns the table (also ``root/table.md``) for
    ``table``, ``study`` or ``seeds`` > 1, else None.

    Args:
      log: where progress lines go (None: nowhere; a multi-process run's other
        processes). ``table.md`` is written by process 0 only.
      seeds: runs per model or setting (seeds ``config.seed``, ``+ 1``, ...).
      jobs: how the runs train (:class:`rhnzoo.studies.sweep.Jobs`; default: in turn,
        in this process).
    """
    say = log or (lambda line: None)
    sweep.check_root(root)  # before anything is trained or written (table.md)
    root = pathlib.Path(root) / f"study_{study}" if study else pathlib.Path(root)
    sweep.check_root(root)
    several = bool(table or study)
    tabled = several or seeds > 1  # a table to show
    seeded = {
        seed_name(name, k): c.replace(seed=c.seed + k)
        for name, c in configs.items()
        for k in range(seeds)
    }
    runs = sweep.seed_runs(
        list(seeded.items()),
        seeds,
        lambda c, k: functools.partial(_train, c, load, say, seeds=k),
        stack=jobs is not None and jobs.stack_seeds,
    )
    if run_missing or not several:
        if jobs is not None and jobs.n > 1:  # in this process, before any child starts:
            dataset = load()  # a data error is one line; word2vec trained once, cached
            for c in {
                (c.embeddings, c.embedding_size(), c.subset): c for c in seeded.values()
            }.values():
                rrl.embeddings_for(c, rrl.subset(dataset, c.subset), say)
        sweep.run_all(runs, root, log=say, jobs=jobs, on_divergence="stop" if tabled else "raise")
    if not tabled:
        return None
    first = next(iter(configs.values()))
    text = (
        study_table(root, list(configs), f"{first.model} {title}", seeds)
        if study
        else table_text(root, list(configs), first.dataset, title, seeds)
    )
    tables.write_table(root / "table.md", text)
    return text
