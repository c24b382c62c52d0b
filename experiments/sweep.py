r"""Depth sweep with and without the Highway State Gate (Shoham & Permuter, Table 1, Fig. 8).

  python experiments/sweep.py --root=runs/sweep --dry_run             # list the 8 runs
  python experiments/sweep.py --root=runs/sweep -- --preset=small     # run them in turn
  python experiments/sweep.py --root=runs/sweep --table               # the table + PNGs

Trains the PTB language model of ``experiments/ptb.py`` once per (depth in ``--depths``)
x (no HSG, HSG), one after another in this process (the corpus read once), each in its
own workdir ``<root>/d<depth>_{rhn,hsg}``, on the multi-run runner
(``rhnzoo.training.sweep``); ptb.py's flags after ``--`` go to every run (``--dry_run``
prints the equivalent ptb.py commands, e.g. for a cluster). Every workdir is checked
first; a finished run says ``already finished``, an interrupted one resumes; a run that
diverges is reported and the sweep goes on.

``--table`` reads the workdirs (their ``config.json`` says depth and HSG) and
prints a markdown table laid out like Shoham & Permuter's Table 1: one row per
depth, validation and test perplexity (batch-1 evaluation of the
best-validation checkpoint, ``results.json``) without and with HSG; cells not
measured show "—". The last column holds published test perplexities only where
they can be cited exactly. It also writes ``learning_curves.png`` (validation
perplexity vs epoch, S&P Fig. 6) and ``ppl_vs_depth.png`` (S&P Fig. 8) to
``--out`` (default: the root).
"""

from __future__ import annotations

import json
import pathlib
import shlex
import sys

from absl import app, flags

from rhnzoo import cli

PTB_SCRIPT = pathlib.Path(__file__).resolve().parent / "ptb.py"
BLANK = "—"
# Published PTB test perplexities: (depth, hsg) -> (perplexity, source).
PAPER_TEST_PPL = {
    (10, False): (65.4, "Zilly et al. 2017, RHN"),
    (40, True): (61.7, "Shoham & Permuter, RHN+HSG"),
}

# ptb.py flags the sweep sets per run (not accepted after --).
SWEEP_OWNED = {"depth", "hsg", "nohsg", "workdir"}

flags.DEFINE_list("depths", ["10", "20", "30", "40"], "Recurrence depths L to sweep.")
flags.DEFINE_string("root", "runs/sweep", "Directory holding one workdir per run.")
flags.DEFINE_boolean("dry_run", False, "Print the commands, one per line, and exit.")
flags.DEFINE_boolean("table", False, "Print the results table and write the PNGs; run nothing.")
flags.DEFINE_string("out", None, "Where --table writes its PNGs (default: --root).")
cli.define_lm_flags(cli.PTB_SOTA, cli.PTB_PRESETS)  # ptb.py's flags, for every run
FLAGS = flags.FLAGS


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


def main(argv) -> None:
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
        out = pathlib.Path(FLAGS.out) if FLAGS.out else root
        for path in write_plots(runs, out):
            print(f"wrote {path}")
        return

    owned = [a for a in extra if a.split("=")[0].lstrip("-") in SWEEP_OWNED]
    owned += [f"--{k}" for k in ("depth", "hsg", "workdir") if FLAGS[k].present]
    if owned:
        sys.exit(f"error: the sweep sets --depth, --hsg and --workdir itself; drop {owned}")
    if FLAGS.dry_run:
        for _, cmd in commands(depths, root, extra):
            print(shlex.join(cmd))
        return
    try:
        FLAGS([sys.argv[0], *extra])  # ptb.py's flags after --
    except flags.Error as e:
        sys.exit(f"error: {' '.join(str(e).split())}")
    cli.main(lambda: train_all(depths, root))


def train_all(depths: list[int], root: pathlib.Path) -> None:
    """The runs in this process on the multi-run runner (see the module docstring)."""
    from rhnzoo import data
    from rhnzoo.training import engine, sweep
    from rhnzoo.training import lm as lm_training

    plan = []
    for depth in depths:
        for hsg in (False, True):
            name = workdir_name(depth, hsg)
            config = cli.lm_config("ptb", depth=depth, hsg=hsg, workdir=str(root / name))
            plan.append((name, config, lm_training.experiment(config)))  # checked up front
    corpus = data.load("ptb", FLAGS.data_dir, download=FLAGS.download, verify=FLAGS.verify_data)
    failed = []

    def trainer(name, experiment):
        def train(workdir):
            try:
                return experiment.train(corpus)
            except engine.TrainingDiverged as e:
                print(f"{name}: {e}", flush=True)
                failed.append(name)
                return None

        return train

    sweep.run_all([sweep.Run(name, config, trainer(name, exp)) for name, config, exp in plan],
                  root)  # fmt: skip
    if failed:
        raise engine.RunError(f"{len(failed)} run(s) diverged: {', '.join(failed)}")
    print(f"done; summarise with: python {sys.argv[0]} --root={root} --table")


if __name__ == "__main__":
    app.run(main)
