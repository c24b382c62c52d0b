r"""Depth sweep with and without the Highway State Gate (Shoham & Permuter, Table 1, Fig. 8).

  python experiments/sweep.py --root=runs/sweep --dry_run             # list the 8 runs
  python experiments/sweep.py --root=runs/sweep -- --preset=small     # run them in turn
  python experiments/sweep.py --root=runs/sweep --jobs=8 -- --preset=small   # side by side
  python experiments/sweep.py --root=runs/sweep --table               # the table + PNGs

Trains the PTB language model of ``experiments/ptb.py`` once per (depth in ``--depths``)
x (no HSG, HSG), one after another in this process (the corpus read once), each in its
own workdir ``<root>/d<depth>_{rhn,hsg}``, on the multi-run runner
(``rhnzoo.studies.sweep``); ptb.py's flags after ``--`` go to every run (``--dry_run``
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

from absl import flags

from rhnzoo.apps import cli, depth_sweep, runner

depth_sweep.define_flags()
flags.adopt_module_key_flags(depth_sweep)
flags.adopt_module_key_flags(runner)

if __name__ == "__main__":
    cli.run_app(depth_sweep.main, positional=True)  # ptb.py's flags after --
