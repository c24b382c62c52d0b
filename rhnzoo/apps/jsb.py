"""``experiments/jsb.py``'s flags and body: the JSB Chorales optimisation study (Zilly et
al. 2017, Fig. 4) on :func:`rhnzoo.training.polyphonic.study`, then its table
(``results.md``) and swarm plot (``jsb_swarm.png``).
"""

from __future__ import annotations

import time

from absl import flags

from rhnzoo import cells
from rhnzoo.apps import cli
from rhnzoo.training import sweep

FLAGS = flags.FLAGS
PRESETS = {
    # 2-core CPU, about 9 minutes (8.7 measured): small widths, few trials and epochs.
    "cpu": {"width": 32, "trials": 10, "epochs": 25, "batch_size": 16},
}
COLORS = {"RHN": "tab:red", "DT-RNN": "tab:blue", "DT(S)-RNN": "tab:green"}


def define_flags() -> None:
    """Defines the script's flags (call once, at import of the script)."""
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
    flags.DEFINE_string("workdir", None, "Output directory (default: runs/jsb_<preset or "
                        "full>); rerunning with it skips the finished trials.")
    flags.DEFINE_alias("verify", "verify_data")
    sweep.define_flags(seeds=False)  # a random search's trials differ already


def run_study() -> None:
    """The script's body: the study from the flags, then its table and figure."""
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
