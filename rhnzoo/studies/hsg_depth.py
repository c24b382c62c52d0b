"""The HSG depth sweep (Shoham & Permuter, Table 1, Fig. 8; docs/hsg.md): each (depth, HSG
or not) run the PTB language model in ``<root>/d<depth>_{rhn,hsg}`` (seed k > 0:
``..._s<k>``), trained on the multi-run runner by :func:`train_all`; :func:`table` lays
out Table 1 from the workdirs (:func:`read_runs`; only measured cells filled; several
seeds: mean ± sd; a run that diverged is named, not shown) beside the papers' numbers
(:data:`PAPER_TEST_PPL`); :func:`write_plots` draws the learning curves (S&P Fig. 6) and
perplexity against depth (Fig. 8). The flags and body: :mod:`rhnzoo.apps.depth_sweep`.
"""

from __future__ import annotations

import functools
import pathlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rhnzoo.engine import workdir as workdir_lib
from rhnzoo.studies import sweep, tables

if TYPE_CHECKING:
    from rhnzoo.configs.lm import LMConfig

BLANK = "—"
# Published PTB test perplexities: (depth, hsg) -> (perplexity, source).
PAPER_TEST_PPL = {
    (10, False): (65.4, "Zilly et al. 2017, RHN"),
    (40, True): (61.7, "Shoham & Permuter, RHN+HSG"),
}


def workdir_name(depth: int, hsg: bool) -> str:
    """The workdir name of a run of ``depth`` with or without HSG: ``d<depth>_{rhn,hsg}``."""
    return f"d{depth}_{'hsg' if hsg else 'rhn'}"


def read_runs(root: pathlib.Path) -> list[dict]:
    """Every workdir under ``root`` with a config.json: its config, results (or None), path."""
    runs = []
    for config_path in sorted(root.glob("*/config.json")):
        workdir = config_path.parent
        results_path = workdir / "results.json"
        runs.append(
            {
                "workdir": workdir,
                "config": workdir_lib.read_config(workdir),
                "results": workdir_lib.read_json(results_path),
            }
        )
    return runs


def diverged_run(run: dict) -> bool:
    """Whether a run of :func:`read_runs` stopped on divergence (its results say so)."""
    return bool(run["results"] and run["results"].get("diverged"))


def table(depths: list[int], runs: list[dict]) -> str:
    """Table 1 in markdown (see the module docstring): finished runs that did not diverge,
    the seeds of one (depth, HSG) as mean ± sd."""
    cells: dict[tuple[int, bool], dict[Any, dict]] = {}
    for run in runs:
        if run["results"] is None or diverged_run(run):
            continue
        key = (int(run["config"]["depth"]), bool(run["config"].get("hsg", False)))
        seed = run["config"].get("seed", 0)
        seen = cells.setdefault(key, {})
        if seed in seen:
            print(
                f"warning: {run['workdir']} repeats depth {key[0]} hsg={key[1]} seed {seed}; "
                f"showing {seen[seed]['workdir']}",
                file=sys.stderr,
            )
            continue
        seen[seed] = run
    header = [
        "Depth L",
        "valid ppl (RHN)",
        "test ppl (RHN)",
        "valid ppl (RHN+HSG)",
        "test ppl (RHN+HSG)",
        "paper test ppl",
    ]
    rows = []
    for depth in sorted(set(depths) | {d for d, _ in cells}):
        row = [depth]
        for hsg in (False, True):
            group = cells.get((depth, hsg), {})
            row += [_cell(group, "valid_ppl"), _cell(group, "test_ppl")]
        paper = [
            f"{p} ({src})" for (d, _), (p, src) in sorted(PAPER_TEST_PPL.items()) if d == depth
        ]
        row.append("; ".join(paper) or None)
        rows.append(row)
    return tables.markdown(header, rows, blank=BLANK, align="rrrrrl")


def _cell(group: dict[Any, dict], name: str) -> str | None:
    """Result ``name`` over a group's seeds as mean ± sd (one decimal); None if none has it."""
    return tables.mean_sd(
        [r["results"][name] for r in group.values() if name in r["results"]], ".1f"
    )


def write_plots(runs: list[dict], out: pathlib.Path) -> list[pathlib.Path]:
    """learning_curves.png and ppl_vs_depth.png from the runs that have the data (the
    first seed of each run: the lowest)."""
    from rhnzoo import analysis  # jax and matplotlib only when plotting

    firsts: dict[tuple[int, bool], dict] = {}
    for run in sorted(runs, key=lambda r: r["config"].get("seed", 0)):
        firsts.setdefault((int(run["config"]["depth"]), bool(run["config"].get("hsg"))), run)
    runs = list(firsts.values())
    written = []
    curves = {}
    for run in sorted(runs, key=lambda r: (r["config"].get("hsg", False), r["config"]["depth"])):
        records = analysis.read_metrics(run["workdir"])
        if records:
            curves[analysis.run_label(run["config"])] = records
    if curves:
        written.append(
            analysis.plot_learning_curves(
                curves, out / "learning_curves.png", title="PTB validation perplexity"
            )
        )
    series: dict[str, dict[int, float]] = {}
    for run in runs:
        if run["results"] and "test_ppl" in run["results"]:
            label = "RHN+HSG (here)" if run["config"].get("hsg") else "RHN (here)"
            series.setdefault(label, {})[int(run["config"]["depth"])] = run["results"]["test_ppl"]
    if series:
        reference: dict[str, dict[int, float]] = {}
        for (depth, hsg), (ppl, source) in PAPER_TEST_PPL.items():
            reference.setdefault(source, {})[depth] = ppl
        written.append(
            analysis.plot_ppl_vs_depth(
                dict(sorted(series.items())), out / "ppl_vs_depth.png", reference=reference
            )
        )
    return written


def train_all(
    configs: Sequence[tuple[str, LMConfig]],
    root: pathlib.Path,
    corpus_loader,
    log=print,
    jobs=None,
    seeds: int = 1,
) -> list[str]:
    """Trains ``(name, config)`` runs, rows of ``seeds`` seeds
    (:func:`rhnzoo.studies.sweep.seed_runs`), in ``root/<name>`` on the runner
    (``on_divergence='stop'``; ``jobs``: :class:`rhnzoo.studies.sweep.Jobs`), the corpus
    read once (``corpus_loader()``); returns the names of the runs that diverged or have
    no results (a child process that failed)."""
    corpus = corpus_loader()
    runs = sweep.seed_runs(
        configs,
        seeds,
        lambda c, k: functools.partial(_train_run, c, corpus, log, seeds=k),
        stack=jobs is not None and jobs.stack_seeds,
    )
    done = sweep.run_all(runs, root, log=log, jobs=jobs, on_divergence="stop")
    return [name for name, results in done.items() if not results or results.get("diverged")]


def _train_run(
    config: LMConfig,
    corpus,
    log,
    workdir: pathlib.Path,
    on_divergence: str,
    seeds: int | None = None,
) -> dict:
    """A :attr:`rhnzoo.studies.sweep.Run.train` (``seeds``: K stacked; the first one's
    results)."""
    from rhnzoo.tasks import lm as lm_training

    out = lm_training.train_and_evaluate(
        config, corpus, workdir=workdir, log=log, on_divergence=on_divergence, seeds=seeds
    )
    return out if seeds is None else out[0]
