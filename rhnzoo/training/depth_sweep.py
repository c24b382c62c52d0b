"""The HSG depth sweep (Shoham & Permuter, Table 1, Fig. 8): its runs, table and plots.

``experiments/sweep.py`` is its flags. Each (depth, HSG or not) run is the PTB language
model of ``experiments/ptb.py`` in ``<root>/d<depth>_{rhn,hsg}`` (seed k > 0:
``..._s<k>``), trained on the multi-run runner (:mod:`rhnzoo.training.sweep`; in this
process or side by side in child processes); :func:`table` lays out Table 1 from the
workdirs (only measured cells filled; several seeds: mean ± sd), :func:`write_plots`
draws the learning curves (S&P Fig. 6) and perplexity against depth (Fig. 8).
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

PTB_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "ptb.py"
BLANK = "—"
# Published PTB test perplexities: (depth, hsg) -> (perplexity, source).
PAPER_TEST_PPL = {
    (10, False): (65.4, "Zilly et al. 2017, RHN"),
    (40, True): (61.7, "Shoham & Permuter, RHN+HSG"),
}


def workdir_name(depth: int, hsg: bool) -> str:
    return f"d{depth}_{'hsg' if hsg else 'rhn'}"


def commands(
    depths: list[int], root: pathlib.Path, extra: list[str], seeds: int = 1, seed: int = 0
) -> list[tuple[pathlib.Path, list[str]]]:
    """``(workdir, argv)`` of every run, depth-major, without HSG before with HSG; seed
    k > 0 of ``seeds`` adds ``--seed=<seed + k>``."""
    from rhnzoo.training import sweep

    runs = []
    for depth in depths:
        for hsg in (False, True):
            for k in range(seeds):
                workdir = root / sweep.seed_name(workdir_name(depth, hsg), k)
                argv = [
                    sys.executable,
                    str(PTB_SCRIPT),
                    f"--depth={depth}",
                    "--hsg" if hsg else "--nohsg",
                    f"--workdir={workdir}",
                    *extra,
                    *([f"--seed={seed + k}"] if k else []),
                ]
                runs.append((workdir, argv))
    return runs


def read_runs(root: pathlib.Path) -> list[dict]:
    """Every workdir under ``root`` with a config.json: its config, results (or None), path."""
    runs = []
    for config_path in sorted(root.glob("*/config.json")):
        workdir = config_path.parent
        results_path = workdir / "results.json"
        runs.append(
            {
                "workdir": workdir,
                "config": json.loads(config_path.read_text()),
                "results": json.loads(results_path.read_text()) if results_path.is_file() else None,
            }
        )
    return runs


def table(depths: list[int], runs: list[dict]) -> list[str]:
    """The markdown lines of the results table (see the module docstring); the runs of
    one (depth, HSG) with different seeds: mean ± sd (:func:`rhnzoo.training.sweep.mean_sd`)."""
    from rhnzoo.training import sweep

    cells: dict[tuple[int, bool], dict[Any, dict]] = {}
    for run in runs:
        if run["results"] is None:
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
    fmt = lambda group, name: sweep.mean_sd(
        [r["results"][name] for r in (group or {}).values() if name in r["results"]], ".1f"
    ) or BLANK
    lines = [
        (
            "| Depth L | valid ppl (RHN) | test ppl (RHN) | valid ppl (RHN+HSG) "
            "| test ppl (RHN+HSG) | paper test ppl |"
        ),
        "|---:|---:|---:|---:|---:|:---|",
    ]
    for depth in sorted(set(depths) | {d for d, _ in cells}):
        row = [str(depth)]
        for hsg in (False, True):
            run = cells.get((depth, hsg))
            row += [fmt(run, "valid_ppl"), fmt(run, "test_ppl")]
        paper = [
            f"{p} ({src})" for (d, _), (p, src) in sorted(PAPER_TEST_PPL.items()) if d == depth
        ]
        row.append("; ".join(paper) or BLANK)
        lines.append("| " + " | ".join(row) + " |")
    return lines


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


def train_all(configs: Sequence[tuple[str, dict[str, Any]]], root: pathlib.Path, corpus_loader,
              log=print, jobs=None) -> list[str]:  # fmt: skip
    """Trains ``(name, config)`` runs (LM configs, :func:`rhnzoo.training.lm.experiment`)
    in ``root/<name>`` on the runner (``jobs``: :class:`rhnzoo.training.sweep.Jobs`),
    every config checked before the corpus is read (``corpus_loader()``, once). A run
    that diverges (or fails in a child process) is reported and the sweep goes on;
    returns the names of those without results."""
    from rhnzoo.training import engine, sweep
    from rhnzoo.training import lm as lm_training

    plan = [(name, config, lm_training.experiment(config)) for name, config in configs]
    corpus = corpus_loader()

    def trainer(name, experiment):
        def train(workdir):
            try:
                return experiment.train(corpus, log=log)
            except engine.TrainingDiverged as e:
                log(f"{name}: {e}")
                return None

        return train

    done = sweep.run_all([sweep.Run(name, config, trainer(name, exp))
                          for name, config, exp in plan], root, log=log, jobs=jobs)  # fmt: skip
    return [name for name, results in done.items() if results is None]
