"""The HSG depth sweep (Shoham & Permuter, Table 1, Fig. 8): ``experiments/sweep.py``'s
flags and body, its runs, table and plots.

Each (depth, HSG or not) run is the PTB language model of ``experiments/ptb.py`` in
``<root>/d<depth>_{rhn,hsg}`` (seed k > 0: ``..._s<k>``), trained on the multi-run runner
(:mod:`rhnzoo.training.sweep`; in this process or side by side in child processes);
:func:`table` lays out Table 1 from the workdirs (only measured cells filled; several
seeds: mean ± sd), :func:`write_plots` draws the learning curves (S&P Fig. 6) and
perplexity against depth (Fig. 8).
"""

from __future__ import annotations

import json
import pathlib
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from absl import flags

from rhnzoo.apps import cli
from rhnzoo.training import sweep

FLAGS = flags.FLAGS
# ptb.py flags the sweep sets per run (not accepted after --).
SWEEP_OWNED = {"depth", "hsg", "nohsg", "workdir"}
PTB_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "ptb.py"
BLANK = "—"
# Published PTB test perplexities: (depth, hsg) -> (perplexity, source).
PAPER_TEST_PPL = {
    (10, False): (65.4, "Zilly et al. 2017, RHN"),
    (40, True): (61.7, "Shoham & Permuter, RHN+HSG"),
}


def define_flags() -> None:
    """Defines the script's flags (call once, at import of the script): its own, ptb.py's
    (given after ``--``, for every run) and the runner's."""
    flags.DEFINE_list("depths", ["10", "20", "30", "40"], "Recurrence depths L to sweep.")
    flags.DEFINE_string("root", "runs/sweep", "Directory holding one workdir per run.")
    flags.DEFINE_boolean("dry_run", False, "Print the commands, one per line, and exit.")
    flags.DEFINE_boolean("table", False, "Print the results table and write the PNGs; run "
                         "nothing.")
    flags.DEFINE_string("out", None, "Where --table writes its PNGs (default: --root).")
    cli.define_lm_flags(cli.PTB_SOTA, cli.PTB_PRESETS)  # ptb.py's flags, for every run
    sweep.define_flags()


def main(argv) -> None:
    """The script's main: ``--table``, ``--dry_run`` or the sweep (ptb.py's flags after
    ``--`` in ``argv``); a bad flag is one ``error: ...`` line."""
    extra = argv[1:]
    try:
        depths = [int(d) for d in FLAGS.depths]
    except ValueError:
        sys.exit(f"error: --depths must be integers, got {','.join(FLAGS.depths)}")
    if any(d < 1 for d in depths):
        sys.exit(f"error: depths must be >= 1, got {depths}")
    root = pathlib.Path(FLAGS.root)

    if FLAGS.table:
        if extra:
            sys.exit(f"error: --table takes no ptb.py flags, got {extra}")
        runs = read_runs(root)
        print("\n".join(table(depths, runs)))
        unfinished = [r["workdir"].name for r in runs if r["results"] is None]
        if unfinished:
            print(f"\nno results.json yet (not in the table): {', '.join(unfinished)}")
        for path in write_plots(runs, pathlib.Path(FLAGS.out) if FLAGS.out else root):
            print(f"wrote {path}")
        return

    owned = [a for a in extra if a.split("=")[0].lstrip("-") in SWEEP_OWNED]
    owned += [f"--{k}" for k in ("depth", "hsg", "workdir") if FLAGS[k].present]
    if owned:
        sys.exit(f"error: the sweep sets --depth, --hsg and --workdir itself; drop {owned}")
    try:
        FLAGS([sys.argv[0], *extra])  # ptb.py's flags after --
    except flags.Error as e:
        sys.exit(f"error: {' '.join(str(e).split())}")
    if FLAGS.dry_run:
        if FLAGS.seeds < 1:
            sys.exit(f"error: --seeds must be >= 1, got {FLAGS.seeds}")
        for _, cmd in commands(depths, root, extra, FLAGS.seeds, FLAGS.seed):
            print(shlex.join(cmd))
        return
    cli.main(lambda: experiment(depths, root))


def experiment(depths: list[int], root: pathlib.Path) -> None:
    """Trains the sweep's runs from the flags (:func:`train_all`; the PTB corpus read once).
    Raises RunError naming the runs that diverged or failed."""
    from rhnzoo import data
    from rhnzoo.training import engine

    jobs, seeds = sweep.from_flags()
    runs = [(d, hsg, k, sweep.seed_name(workdir_name(d, hsg), k))
            for d in depths for hsg in (False, True) for k in range(seeds)]  # fmt: skip
    configs = [(name, cli.lm_config("ptb", depth=d, hsg=hsg, seed=FLAGS.seed + k,
                                    workdir=str(root / name)))
               for d, hsg, k, name in runs]  # fmt: skip
    load = lambda: data.load("ptb", FLAGS.data_dir, download=FLAGS.download, verify=FLAGS.verify_data)
    failed = train_all(configs, root, load, jobs=jobs)
    if failed:
        raise engine.RunError(f"{len(failed)} run(s) diverged or failed: {', '.join(failed)}")
    print(f"done; summarise with: python {sys.argv[0]} --root={root} --table")


def workdir_name(depth: int, hsg: bool) -> str:
    return f"d{depth}_{'hsg' if hsg else 'rhn'}"


def commands(
    depths: list[int], root: pathlib.Path, extra: list[str], seeds: int = 1, seed: int = 0
) -> list[tuple[pathlib.Path, list[str]]]:
    """``(workdir, argv)`` of every run, depth-major, without HSG before with HSG; seed
    k > 0 of ``seeds`` adds ``--seed=<seed + k>``."""
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
    from rhnzoo.training import engine
    from rhnzoo.training import lm as lm_training

    plan = [(name, config, lm_training.experiment(config)) for name, config in configs]
    corpus = corpus_loader()

    def trainer(name, experiment):
        def train(workdir, on_divergence):
            try:
                return experiment.train(corpus, log=log)
            except engine.TrainingDiverged as e:
                log(f"{name}: {e}")
                return None

        return train

    done = sweep.run_all([sweep.Run(name, config, trainer(name, exp))
                          for name, config, exp in plan], root, log=log, jobs=jobs,
                         on_divergence="raise")  # fmt: skip
    return [name for name, results in done.items() if results is None]
