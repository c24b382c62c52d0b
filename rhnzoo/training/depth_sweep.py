"""The HSG depth sweep (Shoham & Permuter, Table 1, Fig. 8): its runs, table and plots.

``experiments/sweep.py`` is its flags. Each (depth, HSG or not) run is the PTB language
model of ``experiments/ptb.py`` in ``<root>/d<depth>_{rhn,hsg}``, trained in one process
on the multi-run runner (:mod:`rhnzoo.training.sweep`); :func:`table` lays out Table 1
from the workdirs (only measured cells filled), :func:`write_plots` draws the learning
curves (S&P Fig. 6) and perplexity against depth (Fig. 8).
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
    depths: list[int], root: pathlib.Path, extra: list[str]
) -> list[tuple[pathlib.Path, list[str]]]:
    """``(workdir, argv)`` of every run, depth-major, without HSG before with HSG."""
    runs = []
    for depth in depths:
        for hsg in (False, True):
            workdir = root / workdir_name(depth, hsg)
            argv = [
                sys.executable,
                str(PTB_SCRIPT),
                f"--depth={depth}",
                "--hsg" if hsg else "--nohsg",
                f"--workdir={workdir}",
                *extra,
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
    """The markdown lines of the results table (see the module docstring)."""
    cells: dict[tuple[int, bool], dict] = {}
    for run in runs:
        if run["results"] is None:
            continue
        key = (int(run["config"]["depth"]), bool(run["config"].get("hsg", False)))
        if key in cells:
            print(
                f"warning: {run['workdir']} repeats depth {key[0]} hsg={key[1]}; "
                f"showing {cells[key]['workdir']}",
                file=sys.stderr,
            )
            continue
        cells[key] = run
    fmt = lambda run, name: (
        f"{run['results'][name]:.1f}" if run and name in run["results"] else BLANK
    )
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
    """learning_curves.png and ppl_vs_depth.png from the runs that have the data."""
    from rhnzoo import analysis  # jax and matplotlib only when plotting

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
              log=print) -> list[str]:  # fmt: skip
    """Trains ``(name, config)`` runs (LM configs, :func:`rhnzoo.training.lm.experiment`)
    in ``root/<name>`` on the runner, every config checked before the corpus is read
    (``corpus_loader()``, once). A run that diverges is reported and the sweep goes on;
    returns the names of those that did."""
    from rhnzoo.training import engine, sweep
    from rhnzoo.training import lm as lm_training

    plan = [(name, config, lm_training.experiment(config)) for name, config in configs]
    corpus = corpus_loader()
    failed = []

    def trainer(name, experiment):
        def train(workdir):
            try:
                return experiment.train(corpus, log=log)
            except engine.TrainingDiverged as e:
                log(f"{name}: {e}")
                failed.append(name)
                return None

        return train

    sweep.run_all([sweep.Run(name, config, trainer(name, exp)) for name, config, exp in plan],
                  root, log=log)  # fmt: skip
    return failed
