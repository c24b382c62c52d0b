"""The HSG depth sweep (Shoham & Permuter, Table 1, Fig. 8): ``experiments/sweep.py``'s
flags and body. The runs, Table 1 and the plots are the study's,
:mod:`rhnzoo.studies.hsg_depth`: ``--table`` prints the table and writes it to
``<out>/table.md`` beside the plots; ``--dry_run`` prints each run's ``ptb.py`` command
(:func:`ptb_script`: the ``ptb.py`` beside the sweep's own script, so the commands hold
wherever the scripts lie, not only in a source checkout).
"""

from __future__ import annotations

import functools
import pathlib
import shlex
import sys
from typing import TYPE_CHECKING

from absl import flags

from rhnzoo.apps import cli, lm, runner
from rhnzoo.engine import workdir as workdir_lib
from rhnzoo.engine.stacking import seed_name
from rhnzoo.studies import hsg_depth, tables

if TYPE_CHECKING:
    from rhnzoo.configs.lm import LMConfig

FLAGS = flags.FLAGS
# ptb.py flags the sweep sets per run (not accepted after --).
SWEEP_OWNED = {"depth", "hsg", "nohsg", "workdir"}
TABLE = "table.md"  # --table's markdown, beside the PNGs


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
    blocked = next((p for p in (root, *root.parents) if p.exists() and not p.is_dir()), None)
    if blocked is not None:  # before any run starts (a run's failed.json went under it)
        where = "is a file" if blocked == root else f"is under {blocked}, a file"
        sys.exit(f"error: --root={root} {where}; the sweep's root is a directory of workdirs")

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
    ``root``). Raises ValueError (one line) for a missing or empty ``root``, one holding
    runs other than ptb.py's (another study's root) or an unreadable run, before anything
    is written."""
    if not root.is_dir():
        raise ValueError(f"--root={root} does not exist: no runs to tabulate")
    runs = hsg_depth.read_runs(root)
    if not runs:
        raise ValueError(f"--root={root} holds no run (no <run>/config.json): nothing to tabulate")
    others = [
        r["workdir"].name
        for r in runs
        if "depth" not in r["config"] or r["config"].get("dataset", "ptb") != "ptb"
    ]
    if others:  # e.g. an rrl.py or highway.py study's root
        raise ValueError(
            f"--root={root} is not a depth sweep's root (by their config.json, "
            f"{', '.join(others)} are no ptb.py runs of a depth)"
        )
    text = hsg_depth.table(depths, runs)
    for run in runs:  # an unreadable metrics.jsonl: one line before anything is written
        workdir_lib.read_metrics(run["workdir"])
    print(text)
    unfinished = [r["workdir"].name for r in runs if r["results"] is None]
    if unfinished:
        print(f"\nno results.json yet (not in the table): {', '.join(unfinished)}")
    diverged = [r["workdir"].name for r in runs if hsg_depth.diverged_run(r)]
    if diverged:
        print(f"\ndiverged (not in the table): {', '.join(diverged)}")
    out = pathlib.Path(FLAGS.out) if FLAGS.out else root
    for path in [tables.write_table(out / TABLE, text), *hsg_depth.write_plots(runs, out)]:
        print(f"wrote {path}")


def runs(depths: list[int], seeds: int) -> list[tuple[int, bool, int, str]]:
    """``(depth, hsg, k, name)`` of every run of the sweep (seed ``k`` of ``seeds``),
    depth-major, without HSG before with HSG, seed-minor."""
    return [
        (d, hsg, k, seed_name(hsg_depth.workdir_name(d, hsg), k))
        for d in depths
        for hsg in (False, True)
        for k in range(seeds)
    ]


def run_configs(depths: list[int], root: pathlib.Path, seeds: int) -> list[tuple[str, LMConfig]]:
    """``(name, config)`` of every run (:func:`runs`) from the flags (each checked: one
    line for a bad setting)."""
    return [
        (name, lm.config("ptb", depth=d, hsg=hsg, seed=FLAGS.seed + k, workdir=str(root / name)))
        for d, hsg, k, name in runs(depths, seeds)
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

    del extra
    jobs, seeds = runner.from_flags()
    configs = run_configs(depths, root, seeds)
    cli.note_interpreted_kernels(configs[0][1].scan_impl)
    if jobs.n == 1:  # this process trains (with --jobs > 1 each child checks its own)
        lm.check_fits(max((c for _, c in configs), key=lambda c: c.depth))  # the largest
    first = configs[0][1]
    load = functools.partial(
        data.load, "ptb", first.data_dir, download=first.download, verify=first.verify_data
    )
    failed = hsg_depth.train_all(configs, root, load, jobs=jobs, seeds=seeds)
    if failed:
        raise workdir_lib.RunError(f"{len(failed)} run(s) diverged or failed: {', '.join(failed)}")
    print(f"done; summarise with: python {sys.argv[0]} --root={root} --table")


def ptb_script() -> pathlib.Path:
    """The ``ptb.py`` script of the sweep's runs: the one beside the running script
    (``sys.argv[0]``, ``experiments/sweep.py``), as an absolute path. The package's
    own location plays no part (installed from a wheel it holds no ``experiments/``)."""
    return pathlib.Path(sys.argv[0]).absolute().with_name("ptb.py")


def commands(
    depths: list[int], root: pathlib.Path, extra: list[str], seeds: int = 1, seed: int = 0
) -> list[tuple[pathlib.Path, list[str]]]:
    """``(workdir, argv)`` of every run (:func:`runs`); seed k > 0 of ``seeds`` adds
    ``--seed=<seed + k>``. ``argv`` is ``[python, ptb.py, ...]`` (:func:`ptb_script`)."""
    python, script = sys.executable, str(ptb_script())
    return [
        (
            root / name,
            [python, script, f"--depth={depth}", "--hsg" if hsg else "--nohsg"]
            + [f"--workdir={root / name}", *extra, *([f"--seed={seed + k}"] if k else [])],
        )
        for depth, hsg, k, name in runs(depths, seeds)
    ]
