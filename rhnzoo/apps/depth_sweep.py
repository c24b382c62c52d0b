"""The HSG depth sweep (Shoham & Permuter, Table 1, Fig. 8): ``experiments/sweep.py``'s
flags and body, its runs, table and plots.

Each (depth, HSG or not) run is the PTB language model of ``experiments/ptb.py`` in
``<root>/d<depth>_{rhn,hsg}`` (seed k > 0: ``..._s<k>``), trained on the multi-run runner
(:mod:`rhnzoo.studies.sweep`; in this process or side by side in child processes);
:func:`table` lays out Table 1 from the workdirs (only measured cells filled; several
seeds: mean ± sd; a run that diverged is named, not shown), which ``--table`` prints and
writes to ``<out>/table.md``; :func:`write_plots` draws the learning curves (S&P Fig. 6)
and perplexity against depth (Fig. 8).
"""

from __future__ import annotations

import functools
import pathlib
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from absl import flags

from rhnzoo.apps import cli, lm, runner
from rhnzoo.studies import sweep, tables
from rhnzoo.engine import workdir as workdir_lib

if TYPE_CHECKING:
    from rhnzoo.tasks.lm import LMConfig

FLAGS = flags.FLAGS
# ptb.py flags the sweep sets per run (not accepted after --).
SWEEP_OWNED = {"depth", "hsg", "nohsg", "workdir"}
PTB_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "ptb.py"
BLANK = "—"
TABLE = "table.md"  # --table's markdown, beside the PNGs
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
    flags.DEFINE_boolean("table", False, "Print the results table and write the PNGs; run nothing.")
    flags.DEFINE_string("out", None, "Where --table writes its PNGs (default: --root).")
    lm.define_flags("ptb")  # ptb.py's flags, for every run
    runner.define_flags()


def main(argv) -> None:
    """The script's main: ``--table``, ``--dry_run`` or the sweep (ptb.py's flags after
    ``--`` in ``argv``); a bad flag is one ``error: ...`` line."""
    extra = argv[1:]
    try:
        depths = [int(d) for d in FLAGS.depths]
    except ValueError:
        sys.exit(f"error: --depths must be integers, got {','.join(FLAGS.depths)}")
    if not depths:
        sys.exit("error: --depths must name at least one depth")
    if any(d < 1 for d in depths):
        sys.exit(f"error: depths must be >= 1, got {depths}")
    root = pathlib.Path(FLAGS.root)

    if FLAGS.table:
        if extra:
            sys.exit(f"error: --table takes no ptb.py flags, got {extra}")
        cli.main(lambda: table_command(depths, root))  # one line for an unreadable run
        return

    owned = [a for a in extra if a.split("=")[0].lstrip("-") in SWEEP_OWNED]
    owned += [f"--{k}" for k in ("depth", "hsg", "workdir") if FLAGS[k].present]
    if owned:
        sys.exit(f"error: the sweep sets --depth, --hsg and --workdir itself; drop {owned}")
    try:
        stray = FLAGS([sys.argv[0], *extra])[1:]  # ptb.py's flags after --
    except flags.Error as e:
        sys.exit(f"error: {' '.join(str(e).split())}")
    if stray:
        sys.exit(f"error: unexpected arguments {' '.join(stray)} (ptb.py's flags go after --)")
    cli.main(lambda: (dry_run if FLAGS.dry_run else experiment)(depths, root, extra))


def table_command(depths: list[int], root: pathlib.Path) -> None:
    """``--table``: prints the table of the runs under ``root`` (:func:`table`), names
    the unfinished and diverged ones, writes it and the plots to ``--out`` (default:
    ``root``). Raises ValueError (one line) for a missing or empty ``root`` or an
    unreadable run, before anything is written."""
    if not root.is_dir():
        raise ValueError(f"--root={root} does not exist: no runs to tabulate")
    runs = read_runs(root)
    if not runs:
        raise ValueError(f"--root={root} holds no run (no <run>/config.json): nothing to tabulate")
    text = table(depths, runs)
    for run in runs:  # an unreadable metrics.jsonl: one line before anything is written
        workdir_lib.read_metrics(run["workdir"])
    print(text)
    unfinished = [r["workdir"].name for r in runs if r["results"] is None]
    if unfinished:
        print(f"\nno results.json yet (not in the table): {', '.join(unfinished)}")
    diverged = [r["workdir"].name for r in runs if diverged_run(r)]
    if diverged:
        print(f"\ndiverged (not in the table): {', '.join(diverged)}")
    out = pathlib.Path(FLAGS.out) if FLAGS.out else root
    for path in [tables.write_table(out / TABLE, text), *write_plots(runs, out)]:
        print(f"wrote {path}")


def run_configs(depths: list[int], root: pathlib.Path, seeds: int) -> list[tuple[str, LMConfig]]:
    """``(name, config)`` of every run of the sweep from the flags (each checked: one
    line for a bad setting), depth-major, without HSG before with HSG, seed-minor."""
    runs = [
        (d, hsg, k, sweep.seed_name(workdir_name(d, hsg), k))
        for d in depths
        for hsg in (False, True)
        for k in range(seeds)
    ]
    return [
        (name, lm.config("ptb", depth=d, hsg=hsg, seed=FLAGS.seed + k, workdir=str(root / name)))
        for d, hsg, k, name in runs
    ]


def dry_run(depths: list[int], root: pathlib.Path, extra: list[str]) -> None:
    """Prints the sweep's ``ptb.py`` commands, one per line, once every run's settings
    are checked (:func:`run_configs`)."""
    _, seeds = runner.from_flags()
    run_configs(depths, root, seeds)
    for _, cmd in commands(depths, root, extra, seeds, FLAGS.seed):
        print(shlex.join(cmd))


def experiment(depths: list[int], root: pathlib.Path, extra: list[str]) -> None:
    """Trains the sweep's runs from the flags (:func:`train_all`; the PTB corpus read once;
    ``extra``, ptb.py's flags, are already parsed). Raises RunError naming the runs that
    diverged or failed."""
    from rhnzoo import data
    from rhnzoo import engine

    del extra
    jobs, seeds = runner.from_flags()
    configs = run_configs(depths, root, seeds)
    if jobs.n == 1:  # this process trains (with --jobs > 1 each child checks its own)
        lm.check_fits(max((c for _, c in configs), key=lambda c: c.depth))  # the largest
    first = configs[0][1]
    load = functools.partial(
        data.load, "ptb", first.data_dir, download=first.download, verify=first.verify_data
    )
    failed = train_all(configs, root, load, jobs=jobs, seeds=seeds)
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
                "config": workdir_lib.read_config(workdir),
                "results": workdir_lib.read_json(results_path),
            }
        )
    return runs


def diverged_run(run: dict) -> bool:
    """Whether a run of :func:`read_runs` stopped on divergence (its results say so)."""
    return bool(run["results"] and run["results"].get("diverged"))


def table(depths: list[int], runs: list[dict]) -> str:
    """The markdown results table (see the module docstring; laid out by
    :func:`rhnzoo.studies.tables.markdown`): finished runs that did not diverge; the runs
    of one (depth, HSG) with different seeds: mean ± sd (:func:`rhnzoo.studies.tables.mean_sd`)."""
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
    """Trains ``(name, config)`` runs (checked :class:`~rhnzoo.tasks.lm.LMConfig`) in
    ``root/<name>`` on the runner (``jobs``: :class:`rhnzoo.studies.sweep.Jobs`), the
    corpus read once (``corpus_loader()``); ``configs`` rows of ``seeds`` seeds
    (:func:`rhnzoo.studies.sweep.seed_runs`; a row's seeds one program with
    ``jobs.stack_seeds``). A run that diverges stops there (the
    runner's ``on_divergence='stop'``: its best parameters evaluated, ``results
    ['diverged']``) and the sweep goes on; returns the names of the runs that diverged
    or have no results (a child process that failed)."""
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
    """A :attr:`rhnzoo.studies.sweep.Run.train`: ``config`` trained on ``corpus`` in
    ``workdir`` (``seeds``: K seeds of it stacked; the first one's results)."""
    from rhnzoo.tasks import lm as lm_training

    out = lm_training.train_and_evaluate(
        config, corpus, workdir=workdir, log=log, on_divergence=on_divergence, seeds=seeds
    )
    return out if seeds is None else out[0]
