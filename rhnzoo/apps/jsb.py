"""``experiments/jsb.py``'s flags and body: the JSB Chorales optimisation study (Zilly et
al. 2017, Fig. 4) on :func:`rhnzoo.studies.jsb.study`, then its table
(``results.md``) and swarm plot (``jsb_swarm.png``). The flags: :func:`define_flags`.
"""

from __future__ import annotations

import pathlib
import time

from absl import flags

from rhnzoo import cells
from rhnzoo.apps import cli, runner
from rhnzoo.configs import jsb as jsb_configs
from rhnzoo.engine import signals
from rhnzoo.studies import jsb as jsb_study
from rhnzoo.studies import tables
from rhnzoo.tasks import polyphonic

FLAGS = flags.FLAGS
COLORS = {"RHN": "tab:red", "DT-RNN": "tab:blue", "DT(S)-RNN": "tab:green"}
_NAMES: list[str] = []  # the flags of JSBConfig's fields


def define_flags() -> None:
    """Defines the script's flags (call once, at import of the script): one per
    :class:`~rhnzoo.configs.jsb.JSBConfig` field it offers (but its ``NOT_FLAGS``),
    ``--preset``, ``--verify`` (an alias of ``--verify_data``) and the runner's."""
    defaults = jsb_configs.get_config(None)
    _NAMES.extend(
        cli.define_config_flags(defaults, list(jsb_configs.PRESETS), module_name=__name__)
    )
    flags.DEFINE_alias("verify", "verify_data", module_name=__name__)
    runner.define_flags(seeds=False)  # a random search's trials differ already


def config_from_flags() -> jsb_configs.JSBConfig:
    """The study's settings: ``--preset``'s, with the flags given over them. Raises
    ValueError (one line) for a bad value."""
    return cli.config_from_flags(jsb_configs.get_config, _NAMES)


def check_fits(config: jsb_configs.JSBConfig) -> None:
    """Refuses (:func:`rhnzoo.apps.cli.check_fits`: one line) a study whose largest trial
    model (:func:`rhnzoo.studies.jsb.plan`) cannot hold its parameters and SGD
    state on a device, before the data are read."""
    import jax

    sizes = jsb_study.plan(config.archs, config.depths, config.width)
    (arch, depth), size = max(sizes.items(), key=lambda item: item[1]["params"])
    model = jsb_configs.study_model(arch, size["hidden"], depth)

    def state():
        params = model.init(jax.random.PRNGKey(0))
        return {"params": params, "opt_state": polyphonic.sgd(0.1, 0.9, 1.0).init(params)}

    cli.check_fits(
        state,
        f"--width={config.width} ({cells.label(arch)} at depth {depth}: width {size['hidden']})",
    )


def run_study() -> None:
    """The script's body: the study from the flags, then its table and figure."""
    from rhnzoo.data.music import load_jsb

    jobs, _ = runner.from_flags()
    config = config_from_flags()
    cli.note_interpreted_kernels(config.scan_impl)
    if jobs.n == 1:  # this process trains (with --jobs > 1 each child checks its own)
        check_fits(config)
    data = load_jsb(config.data_dir, download=config.download, verify=config.verify_data)
    workdir = pathlib.Path(config.workdir or f"runs/jsb_{config.preset or 'full'}").absolute()
    start = time.perf_counter()
    try:
        rows = jsb_study.study(data, workdir, config, jobs=jobs)
    except signals.Interrupted as e:
        done = len(list((workdir / "trials").glob("*/results.json")))
        print(
            f"stopped by signal {e.signum}; {done} finished trials are in "
            f"{workdir / 'trials'}; rerun with the same --workdir to continue",
            flush=True,
        )
        raise
    sizes = jsb_study.plan(config.archs, config.depths, config.width)
    table = jsb_study.study_table(rows, config, sizes)
    write_outputs(workdir, config, rows, table)
    print(table)
    print(
        f"wrote {workdir / 'results.md'}, {workdir / 'jsb_swarm.png'}, {workdir / 'results.jsonl'}"
    )
    print(f"total {time.perf_counter() - start:.0f} s")


def write_outputs(
    workdir: pathlib.Path, config: jsb_configs.JSBConfig, rows: list[dict], table: str
) -> None:
    """``results.md`` (the table under its heading) and ``jsb_swarm.png`` (Fig. 4 style:
    every trial's test NLL per architecture and depth)."""
    from rhnzoo.analysis import plots

    tables.write_table(
        workdir / "results.md",
        "# JSB Chorales optimisation study (Zilly et al. 2017, Fig. 4)\n\n"
        f"Test NLL per time step in nats; target parameter count = RHN of width "
        f"{config.width}; {config.trials} trials x {config.epochs} epochs, batch "
        f"{config.batch_size}, seed {config.seed}, matmul precision {config.matmul_precision}.\n\n"
        + table,
    )
    points = {
        cells.label(a): {
            d: [r["test_nll"] for r in rows if (r["arch"], r["depth"]) == (a, d)]
            for d in config.depths
        }
        for a in config.archs
    }
    plots.plot_trial_swarm(points, workdir / "jsb_swarm.png", colors=COLORS)
