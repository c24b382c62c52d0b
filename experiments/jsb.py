r"""Optimisation study on JSB Chorales: RHN vs DT-RNN vs DT(S)-RNN (Zilly et al. 2017, Fig. 4).

  python experiments/jsb.py                          # full study (see FLAGS for its size)
  python experiments/jsb.py --preset=cpu             # 2-core CPU, about 9 minutes
  python experiments/jsb.py --archs=rhn,dtrnn --depths=1,4 --trials=10 --epochs=20

Zilly et al. (sec. 5.1): at recurrence depths 1, 2, 4 and 6 the architectures have the
same number of parameters (the target: the whole model on an RHN of ``--width``; the others
get the closest width), every (architecture, depth) gets the same random search over the
SGD hyperparameters (``rhnzoo.training.polyphonic.SEARCH_SPACE``, one draw per trial index,
so the comparison is paired), and Fig. 4 plots every trial's test NLL at its
best-validation epoch. Any registered cell can join (``--archs=rhn,lstm,hsg_gru``).

The study is ``rhnzoo.training.polyphonic.study``: each trial a run of the multi-run
runner in ``<workdir>/trials/<arch>_d<depth>_t<trial>`` (config.json + results.json;
trained in memory). Also in ``--workdir``: ``results.jsonl`` (one line per trial),
``jsb_swarm.png`` (Fig. 4 style), ``results.md`` (best/median test NLL per architecture
and depth). Rerunning with the same workdir skips the finished trials. ``--jobs=N``
trains N trials at a time, each in a child process (this command with
``--sweep_run=<trial>``; it compiles its own step, so this pays off for trials longer
than a process start, about 10 s).
"""

from __future__ import annotations

import time

from absl import flags

from rhnzoo import cells, cli
from rhnzoo.training import sweep

PRESETS = {
    # 2-core CPU, about 9 minutes (8.7 measured): small widths, few trials and epochs.
    "cpu": {"width": 32, "trials": 10, "epochs": 25, "batch_size": 16},
}
COLORS = {"RHN": "tab:red", "DT-RNN": "tab:blue", "DT(S)-RNN": "tab:green"}

cli.define_presets(PRESETS)
cli.define_data_flags()
cli.define_precision_flag()
flags.DEFINE_list("archs", ["rhn", "dtrnn", "dtsrnn"], "Architectures: any registered cell "
                  f"({', '.join(cells.ALL_NAMES)}).")
flags.DEFINE_list("depths", ["1", "2", "4", "6"], "Recurrence (transition) depths.")
flags.DEFINE_integer("trials", 20, "Random-search trials per (architecture, depth).")
flags.DEFINE_integer("epochs", 40, "Epochs per trial (best validation epoch kept; alias "
                     "--max_epochs).")
flags.DEFINE_alias("max_epochs", "epochs")
flags.DEFINE_integer("max_steps", None, "Stop every trial after this many steps (>= 1).")
flags.DEFINE_integer(
    "width", 64, "RHN width defining the target parameter count at each depth (see above)."
)
flags.DEFINE_integer("batch_size", 16, "Sequences per SGD step (whole-sequence BPTT).")
flags.DEFINE_integer("seed", 0, "Seed of the hyperparameter draws, initialisation, shuffling.")
flags.DEFINE_string("workdir", None, "Output directory (default: runs/jsb_<preset or full>); "
                    "rerunning with it skips the finished trials.")
flags.DEFINE_alias("verify", "verify_data")
sweep.define_flags(seeds=False)  # a random search's trials differ already
flags.adopt_module_key_flags(cli)
flags.adopt_module_key_flags(sweep)
FLAGS = flags.FLAGS


def run_study() -> None:
    from rhnzoo.analysis import plots
    from rhnzoo.data.music import load_jsb
    from rhnzoo.training import engine, polyphonic

    cli.apply_preset()
    jobs, _ = sweep.from_flags()
    unknown = [a for a in FLAGS.archs if a not in cells.ALL_NAMES]
    if unknown or not FLAGS.archs:
        raise ValueError(f"--archs must be a non-empty subset of {list(cells.ALL_NAMES)}, "
                         f"got {unknown}")  # fmt: skip
    try:
        depths = [int(d) for d in FLAGS.depths]
    except ValueError:
        raise ValueError(f"--depths must be integers, got {FLAGS.depths}") from None
    settings = {k: FLAGS[k].value for k in polyphonic.STUDY_KEYS}
    checks = [(k, v) for k, v in settings.items()
              if k not in ("seed", "matmul_precision") and v is not None]  # fmt: skip
    for name, value in checks + [("trials", FLAGS.trials), *(("depth", d) for d in depths)]:
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    archs, depths = list(dict.fromkeys(FLAGS.archs)), list(dict.fromkeys(depths))
    data = load_jsb(FLAGS.data_dir, download=FLAGS.download, verify=FLAGS.verify_data)
    workdir = engine.prepare_workdir(FLAGS.workdir or f"runs/jsb_{FLAGS.preset or 'full'}",
                                     settings, resumable_keys=())  # fmt: skip
    sizes = polyphonic.plan(archs, depths, FLAGS.width)
    print(f"parameter counts (target: RHN of width {FLAGS.width} at each depth):")
    for (arch, depth), s in sizes.items():
        print(f"  {cells.label(arch):>9} depth {depth}: hidden {s['hidden']:4d}, "
              f"{s['params']:8,d} params (target {s['target']:,}, "
              f"{100 * (s['params'] / s['target'] - 1):+.2f}%)")  # fmt: skip
    start = time.perf_counter()
    try:
        rows = polyphonic.study(data, workdir, archs, depths, trials=FLAGS.trials, jobs=jobs,
                                **settings)  # fmt: skip
    except engine.Interrupted as e:
        done = len(list((workdir / "trials").glob("*/results.json")))
        print(f"stopped by signal {e.signum}; {done} finished trials are in "
              f"{workdir / 'trials'}; rerun with the same --workdir to continue", flush=True)
        raise
    table = polyphonic.study_table(rows, archs, depths, sizes)
    (workdir / "results.md").write_text(
        "# JSB Chorales optimisation study (Zilly et al. 2017, Fig. 4)\n\n"
        f"Test NLL per time step in nats; target parameter count = RHN of width "
        f"{FLAGS.width}; {FLAGS.trials} trials x {FLAGS.epochs} epochs, batch "
        f"{FLAGS.batch_size}, seed {FLAGS.seed}, matmul precision {FLAGS.matmul_precision}.\n\n"
        + table + "\n"
    )
    points = {cells.label(a): {d: [r["test_nll"] for r in rows if (r["arch"], r["depth"]) == (a, d)]
                               for d in depths} for a in archs}  # fmt: skip
    plots.plot_trial_swarm(points, workdir / "jsb_swarm.png", colors=COLORS)
    print(table)
    print(f"wrote {workdir / 'results.md'}, {workdir / 'jsb_swarm.png'}, {workdir / 'results.jsonl'}")
    print(f"total {time.perf_counter() - start:.0f} s")


def main(argv) -> None:
    del argv
    cli.main(run_study)


if __name__ == "__main__":
    cli.run_app(main)
