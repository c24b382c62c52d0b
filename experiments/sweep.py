r"""Depth sweep with and without the Highway State Gate (Shoham & Permuter, Table 1, Fig. 8).

  python experiments/sweep.py --root=runs/sweep --dry_run             # list the 8 runs
  python experiments/sweep.py --root=runs/sweep -- --preset=small     # run them in turn
  python experiments/sweep.py --root=runs/sweep --jobs=8 -- --preset=small   # side by side
  python experiments/sweep.py --root=runs/sweep --table               # the table + PNGs

Trains the PTB language model of ``experiments/ptb.py`` once per (depth in ``--depths``)
x (no HSG, HSG), one after another in this process (the corpus read once), each in its
own workdir ``<root>/d<depth>_{rhn,hsg}``, on the multi-run runner
(``rhnzoo.training.sweep``); ptb.py's flags after ``--`` go to every run (``--dry_run``
prints the equivalent ptb.py commands, e.g. for a cluster). Every workdir is checked
first; a finished run says ``already finished``, an interrupted one resumes; a run that
diverges is reported and the sweep goes on. ``--jobs=N`` trains N runs at a time, each
in a child process (output in ``<workdir>/sweep.log``); ``--seeds=K`` trains every run
with seeds --seed ... --seed+K-1 (seed k > 0 in ``<root>/d<depth>_{rhn,hsg}_s<k>``).

``--table`` reads the workdirs (their ``config.json`` says depth and HSG) and
prints a markdown table laid out like Shoham & Permuter's Table 1: one row per
depth, validation and test perplexity (batch-1 evaluation of the
best-validation checkpoint, ``results.json``) without and with HSG; cells not
measured show "—". The last column holds published test perplexities only where
they can be cited exactly. It also writes ``learning_curves.png`` (validation
perplexity vs epoch, S&P Fig. 6) and ``ppl_vs_depth.png`` (S&P Fig. 8) to
``--out`` (default: the root). Runs of one depth and HSG with different seeds show as
mean ± sd (n); the figures show the lowest seed.
"""

from __future__ import annotations

import pathlib
import shlex
import sys

from absl import app, flags

from rhnzoo import cli
from rhnzoo.training import sweep

# ptb.py flags the sweep sets per run (not accepted after --).
SWEEP_OWNED = {"depth", "hsg", "nohsg", "workdir"}

flags.DEFINE_list("depths", ["10", "20", "30", "40"], "Recurrence depths L to sweep.")
flags.DEFINE_string("root", "runs/sweep", "Directory holding one workdir per run.")
flags.DEFINE_boolean("dry_run", False, "Print the commands, one per line, and exit.")
flags.DEFINE_boolean("table", False, "Print the results table and write the PNGs; run nothing.")
flags.DEFINE_string("out", None, "Where --table writes its PNGs (default: --root).")
cli.define_lm_flags(cli.PTB_SOTA, cli.PTB_PRESETS)  # ptb.py's flags, for every run
sweep.define_flags()
flags.adopt_module_key_flags(sweep)
FLAGS = flags.FLAGS


def main(argv) -> None:
    from rhnzoo.training import depth_sweep as ds

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
        runs = ds.read_runs(root)
        print("\n".join(ds.table(depths, runs)))
        unfinished = [r["workdir"].name for r in runs if r["results"] is None]
        if unfinished:
            print(f"\nno results.json yet (not in the table): {', '.join(unfinished)}")
        for path in ds.write_plots(runs, pathlib.Path(FLAGS.out) if FLAGS.out else root):
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
        for _, cmd in ds.commands(depths, root, extra, FLAGS.seeds, FLAGS.seed):
            print(shlex.join(cmd))
        return
    cli.main(lambda: train_all(depths, root))


def train_all(depths: list[int], root: pathlib.Path) -> None:
    from rhnzoo import data
    from rhnzoo.training import depth_sweep as ds
    from rhnzoo.training import engine

    jobs, seeds = sweep.from_flags()
    runs = [(d, hsg, k, sweep.seed_name(ds.workdir_name(d, hsg), k))
            for d in depths for hsg in (False, True) for k in range(seeds)]  # fmt: skip
    configs = [(name, cli.lm_config("ptb", depth=d, hsg=hsg, seed=FLAGS.seed + k,
                                    workdir=str(root / name)))
               for d, hsg, k, name in runs]  # fmt: skip
    load = lambda: data.load("ptb", FLAGS.data_dir, download=FLAGS.download, verify=FLAGS.verify_data)
    failed = ds.train_all(configs, root, load, jobs=jobs)
    if failed:
        raise engine.RunError(f"{len(failed)} run(s) diverged or failed: {', '.join(failed)}")
    print(f"done; summarise with: python {sys.argv[0]} --root={root} --table")


if __name__ == "__main__":
    app.run(main)
