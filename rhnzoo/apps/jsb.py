"""``experiments/jsb.py``'s flags and body: the JSB Chorales optimisation study (Zilly et
al. 2017, Fig. 4) on :func:`rhnzoo.training.polyphonic.study`, then its table
(``results.md``) and swarm plot (``jsb_swarm.png``).
"""

from __future__ import annotations

import pathlib
import time

from absl import flags

from rhnzoo import cells
from rhnzoo.apps import cli
from rhnzoo.configs import jsb as jsb_configs
from rhnzoo.training import polyphonic, sweep

FLAGS = flags.FLAGS
COLORS = {"RHN": "tab:red", "DT-RNN": "tab:blue", "DT(S)-RNN": "tab:green"}


def define_flags() -> None:
    """Defines the script's flags (call once, at import of the script); their defaults
    are the full study's (:func:`rhnzoo.configs.jsb.get_config`)."""
    d = jsb_configs.get_config()
    cli.define_presets(jsb_configs.PRESETS)
    cli.define_data_flags()
    cli.define_precision_flag()
    flags.DEFINE_list("archs", list(d.archs), "Architectures: any registered cell "
                      f"({', '.join(cells.ALL_NAMES)}).")  # fmt: skip
    flags.DEFINE_list("depths", [str(x) for x in d.depths], "Recurrence (transition) depths.")
    flags.DEFINE_integer("trials", d.trials, "Random-search trials per (architecture, depth).")
    flags.DEFINE_integer("epochs", d.epochs, "Epochs per trial (best validation epoch kept; "
                         "alias --max_epochs).")  # fmt: skip
    flags.DEFINE_alias("max_epochs", "epochs")
    flags.DEFINE_integer("max_steps", d.max_steps, "Stop every trial after this many steps "
                         "(>= 1).")  # fmt: skip
    flags.DEFINE_integer(
        "width", d.width, "RHN width defining the target parameter count at each depth (see "
        "above)."
    )  # fmt: skip
    flags.DEFINE_integer("batch_size", d.batch_size, "Sequences per SGD step (whole-sequence "
                         "BPTT).")  # fmt: skip
    flags.DEFINE_integer("seed", d.seed, "Seed of the hyperparameter draws, initialisation, "
                         "shuffling.")  # fmt: skip
    flags.DEFINE_string("workdir", None, "Output directory (default: runs/jsb_<preset or "
                        "full>); rerunning with it skips the finished trials.")
    flags.DEFINE_alias("verify", "verify_data")
    sweep.define_flags(seeds=False)  # a random search's trials differ already


def _integers(values) -> tuple:
    """``values`` as ints, or unchanged when one is not an integer (the config says so)."""
    try:
        return tuple(int(v) for v in values)
    except ValueError:
        return tuple(values)


def config_from_flags() -> polyphonic.JSBConfig:
    """The study's settings from the flags (``--preset`` applied first). Raises
    ValueError (one line) for a bad value."""
    return polyphonic.JSBConfig(
        archs=tuple(FLAGS.archs), depths=_integers(FLAGS.depths), trials=FLAGS.trials,
        **cli.flag_values(polyphonic.STUDY_KEYS),
    )  # fmt: skip


def run_study() -> None:
    """The script's body: the study from the flags, then its table and figure."""
    from rhnzoo.data.music import load_jsb
    from rhnzoo.training import engine

    cli.apply_preset()
    jobs, _ = sweep.from_flags()
    config = config_from_flags()
    data = load_jsb(FLAGS.data_dir, download=FLAGS.download, verify=FLAGS.verify_data)
    workdir = engine.prepare_workdir(FLAGS.workdir or f"runs/jsb_{FLAGS.preset or 'full'}",
                                     config.settings(), resumable_keys=())  # fmt: skip
    sizes = polyphonic.plan(config.archs, config.depths, config.width)
    print(f"parameter counts (target: RHN of width {config.width} at each depth):")
    for (arch, depth), s in sizes.items():
        print(f"  {cells.label(arch):>9} depth {depth}: hidden {s['hidden']:4d}, "
              f"{s['params']:8,d} params (target {s['target']:,}, "
              f"{100 * (s['params'] / s['target'] - 1):+.2f}%)")  # fmt: skip
    start = time.perf_counter()
    try:
        rows = polyphonic.study(data, workdir, config, jobs=jobs)
    except engine.Interrupted as e:
        done = len(list((workdir / "trials").glob("*/results.json")))
        print(f"stopped by signal {e.signum}; {done} finished trials are in "
              f"{workdir / 'trials'}; rerun with the same --workdir to continue", flush=True)
        raise
    table = polyphonic.study_table(rows, config, sizes)
    write_outputs(workdir, config, rows, table)
    print(table)
    print(f"wrote {workdir / 'results.md'}, {workdir / 'jsb_swarm.png'}, {workdir / 'results.jsonl'}")
    print(f"total {time.perf_counter() - start:.0f} s")


def write_outputs(workdir: pathlib.Path, config: polyphonic.JSBConfig, rows: list[dict],
                  table: str) -> None:  # fmt: skip
    """``results.md`` (the table under its heading) and ``jsb_swarm.png`` (Fig. 4 style:
    every trial's test NLL per architecture and depth)."""
    from rhnzoo.analysis import plots

    sweep.write_table(
        workdir / "results.md",
        "# JSB Chorales optimisation study (Zilly et al. 2017, Fig. 4)\n\n"
        f"Test NLL per time step in nats; target parameter count = RHN of width "
        f"{config.width}; {config.trials} trials x {config.epochs} epochs, batch "
        f"{config.batch_size}, seed {config.seed}, matmul precision {config.matmul_precision}.\n\n"
        + table,
    )  # fmt: skip
    points = {cells.label(a): {d: [r["test_nll"] for r in rows if (r["arch"], r["depth"]) == (a, d)]
                               for d in config.depths} for a in config.archs}  # fmt: skip
    plots.plot_trial_swarm(points, workdir / "jsb_swarm.png", colors=COLORS)
