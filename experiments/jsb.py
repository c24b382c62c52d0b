r"""Optimisation study on JSB Chorales: RHN vs DT-RNN vs DT(S)-RNN (Zilly et al. 2017, Fig. 4).

  python experiments/jsb.py                          # full study (see FLAGS for its size)
  python experiments/jsb.py --preset=cpu             # 2-core CPU, about 9 minutes
  python experiments/jsb.py --archs=rhn,dtrnn --depths=1,4 --trials=10 --epochs=20

Zilly et al. (sec. 5.1): networks of recurrence depth 1, 2, 4 and 6 are trained with
SGD for next-step prediction on JSB Chorales; at each depth the three architectures
have the same number of parameters, and that number grows with depth; every
(architecture, depth) gets a random search over the SGD hyperparameters with the same
number of trials, and Fig. 4 plots the test NLL of every trial. Without optimisation
difficulties the bigger, deeper networks should do at least as well as the shallow ones.

Parameter matching: the target count at depth L is the parameter count of the whole
model (cell + 88-way output layer) built on an RHN of width ``--width`` at depth L.
The RHN gets that width; DT-RNN and DT(S)-RNN get the width whose count is closest to
the target (all three are printed and written to the table).

Random search (one draw per trial index, shared by every architecture and depth, so
the comparison is paired): learning rate log-uniform in [10^-2.5, 10^0]; momentum 0
(plain SGD) with probability 1/2, else 1 - 10^U(-2, -1) (0.9 .. 0.99); global-norm
clip log-uniform in [1, 100]; uniform init half-width log-uniform in [0.01, 0.3];
RHN transform-gate bias uniform in [-4, 0]. Each trial keeps its best-validation epoch
and reports the test NLL there (nats per time step).

Outputs in ``--workdir``: ``results.jsonl`` (one line per trial), ``jsb_swarm.png`` (Fig.
4 style strip plot), ``results.md`` (best/median test NLL per architecture and depth).
Rerunning with the same workdir skips the trials already in results.jsonl.
"""

from __future__ import annotations

import json
import math
import pathlib
import time

import jax
import numpy as np
from absl import flags

from rhnzoo import cells, cli
from rhnzoo.data.music import load_jsb
from rhnzoo.training import engine, polyphonic



def make_cell(arch: str, n: int, depth: int, init_scale: float, init_bias: float):
    """Any registered cell (rhnzoo.cells.make) with the settings it takes of these."""
    settings = dict(depth=depth, init_scale=init_scale, init_bias=init_bias)
    return cells.make(arch, n, **cells.applicable(arch, settings))


ARCHS = cells.ALL_NAMES
LABELS = {name: cells.label(name) for name in ARCHS}
COLORS = {"rhn": "tab:red", "dtrnn": "tab:blue", "dtsrnn": "tab:green"}
SEARCH_SPACE = {
    "log10_lr": (-2.5, 0.0),
    "p_momentum": 0.5,
    "log10_one_minus_momentum": (-2.0, -1.0),
    "log10_max_grad_norm": (0.0, 2.0),
    "log10_init_scale": (-2.0, math.log10(0.3)),
    "init_bias": (-4.0, 0.0),
}
PRESETS = {
    # 2-core CPU, about 9 minutes (8.7 measured): small widths, few trials and epochs.
    "cpu": {"width": 32, "trials": 10, "epochs": 25, "batch_size": 16},
}

cli.define_presets(PRESETS)
cli.define_data_flags()
flags.DEFINE_list("archs", ["rhn", "dtrnn", "dtsrnn"], "Architectures: any registered cell "
                  f"({', '.join(ARCHS)}).")
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
flags.adopt_module_key_flags(cli)
FLAGS = flags.FLAGS

# Settings that must match for a rerun to extend an existing results.jsonl.
RUN_KEYS = ("width", "epochs", "batch_size", "seed", "max_steps")


def sample_hparams(seed: int, trial: int) -> dict:
    """The hyperparameters of trial ``trial``: a function of (seed, trial) only."""
    rng = np.random.default_rng([seed, trial])
    s = SEARCH_SPACE
    plain = rng.uniform() < s["p_momentum"]
    one_minus = 10 ** rng.uniform(*s["log10_one_minus_momentum"])
    return {
        "lr": float(10 ** rng.uniform(*s["log10_lr"])),
        "momentum": 0.0 if plain else float(1.0 - one_minus),
        "max_grad_norm": float(10 ** rng.uniform(*s["log10_max_grad_norm"])),
        "init_scale": float(10 ** rng.uniform(*s["log10_init_scale"])),
        "init_bias": float(rng.uniform(*s["init_bias"])),
    }


def count(arch: str, n: int, depth: int) -> int:
    return polyphonic.num_params(polyphonic.PianoRollModel(make_cell(arch, n, depth, 0.04, -2.0)))


def matched_width(arch: str, depth: int, target: int) -> int:
    """Width n >= 1 whose model parameter count is closest to ``target`` (counts grow with n)."""
    lo, hi = 1, 1
    while count(arch, hi, depth) < target:
        hi *= 2
    while lo < hi:  # smallest n with count >= target
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if count(arch, mid, depth) < target else (lo, mid)
    below = max(lo - 1, 1)
    return min((below, lo), key=lambda n: (abs(count(arch, n, depth) - target), n))


def plan(archs, depths, width) -> dict:
    """{(arch, depth): dict(hidden, params, target)} with targets from an RHN of ``width``."""
    out = {}
    for depth in depths:
        target = count("rhn", width, depth)
        for arch in archs:
            n = width if arch == "rhn" else matched_width(arch, depth, target)
            out[arch, depth] = {"hidden": n, "params": count(arch, n, depth), "target": target}
    return out


def read_results(path: pathlib.Path) -> list[dict]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:  # strict JSON stores a non-finite NLL as null
        for key in ("valid_nll", "test_nll"):
            row[key] = math.inf if row[key] is None else row[key]
    return rows


def summarise(rows: list[dict], archs, depths, sizes) -> str:
    """Markdown table: per (arch, depth) the test NLL of the best-validation trial and the
    median over trials (failed trials count as +inf)."""
    lines = [
        (
            "| architecture | depth | hidden | params | target | trials | failed | "
            "test NLL (best valid trial) | median test NLL | best valid NLL |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for depth in depths:
        for arch in archs:
            mine = [r for r in rows if r["arch"] == arch and r["depth"] == depth]
            tests = [r["test_nll"] if math.isfinite(r["valid_nll"]) else math.inf for r in mine]
            failed = sum(not math.isfinite(t) for t in tests)
            best = min(mine, key=lambda r: r["valid_nll"]) if mine else None
            fmt = lambda v: f"{v:.3f}" if math.isfinite(v) else "inf"
            s = sizes[arch, depth]
            lines.append(
                f"| {LABELS[arch]} | {depth} | {s['hidden']} | {s['params']:,} | "
                f"{s['target']:,} | {len(mine)} | {failed} | "
                f"{fmt(best['test_nll']) if best else '-'} | "
                f"{fmt(float(np.median(tests))) if tests else '-'} | "
                f"{fmt(best['valid_nll']) if best else '-'} |"
            )
    return "\n".join(lines)


def swarm_plot(rows: list[dict], archs, depths, path: pathlib.Path) -> None:
    """Fig. 4 style: x = depth, one offset column per architecture, one dot per trial
    (test NLL at its best validation epoch), a bar at each median."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    width = 0.8 / len(archs)
    rng = np.random.default_rng(0)
    for a, arch in enumerate(archs):
        for d, depth in enumerate(depths):
            ys = np.array(
                [
                    r["test_nll"]
                    for r in rows
                    if r["arch"] == arch and r["depth"] == depth and math.isfinite(r["test_nll"])
                ]
            )
            x0 = d + (a - (len(archs) - 1) / 2) * width
            if ys.size:
                xs = x0 + rng.uniform(-0.35, 0.35, ys.size) * width
                label = LABELS[arch] if d == 0 else None
                color = COLORS.get(arch, f"C{a}")
                ax.scatter(xs, ys, s=14, color=color, alpha=0.8, lw=0, label=label)
                ax.hlines(np.median(ys), x0 - 0.4 * width, x0 + 0.4 * width, color="k", lw=1)
    ax.set_xticks(range(len(depths)), [str(d) for d in depths])
    ax.set_xlabel("recurrence depth")
    ax.set_ylabel("test NLL per time step (nats)")
    ax.set_title("JSB Chorales, random search over SGD hyperparameters")
    ax.legend(frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def study() -> None:
    cli.apply_preset()
    unknown = [a for a in FLAGS.archs if a not in ARCHS]
    if unknown or not FLAGS.archs:
        raise ValueError(f"--archs must be a non-empty subset of {list(ARCHS)}, got {unknown}")
    try:
        depths = [int(d) for d in FLAGS.depths]
    except ValueError:
        raise ValueError(f"--depths must be integers, got {FLAGS.depths}") from None
    checks = [(name, FLAGS[name].value) for name in ("trials", "epochs", "width", "batch_size")]
    checks += [("max_steps", FLAGS.max_steps)] if FLAGS.max_steps is not None else []
    for name, value in checks + [("depth", d) for d in depths]:
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    archs = list(dict.fromkeys(FLAGS.archs))
    depths = list(dict.fromkeys(depths))
    data = load_jsb(FLAGS.data_dir, download=FLAGS.download, verify=FLAGS.verify_data)
    workdir = engine.prepare_workdir(
        FLAGS.workdir or f"runs/jsb_{FLAGS.preset or 'full'}",
        {k: FLAGS[k].value for k in RUN_KEYS},
        resumable_keys=(),
    )
    results_path = workdir / "results.jsonl"
    rows = read_results(results_path)
    done = {(r["arch"], r["depth"], r["trial"]) for r in rows}

    sizes = plan(archs, depths, FLAGS.width)
    print(f"parameter counts (target: RHN of width {FLAGS.width} at each depth):")
    for (arch, depth), s in sizes.items():
        print(
            f"  {LABELS[arch]:>9} depth {depth}: hidden {s['hidden']:4d}, "
            f"{s['params']:8,d} params (target {s['target']:,}, "
            f"{100 * (s['params'] / s['target'] - 1):+.2f}%)"
        )
    total = len(archs) * len(depths) * FLAGS.trials
    start = time.perf_counter()
    # Trials outermost: a run cut short still has every (arch, depth) with some trials.
    for trial in range(FLAGS.trials):
        hp = sample_hparams(FLAGS.seed, trial)
        for depth in depths:
            for arch in archs:
                if (arch, depth, trial) in done:
                    continue
                n = sizes[arch, depth]["hidden"]
                # The static model uses fixed init settings so that every trial reuses one
                # compiled step; the trial's init_scale / init_bias only shape the params.
                model = polyphonic.PianoRollModel(make_cell(arch, n, depth, 0.04, -2.0))
                init_model = polyphonic.PianoRollModel(
                    make_cell(arch, n, depth, hp["init_scale"], hp["init_bias"])
                )
                key = jax.random.fold_in(jax.random.PRNGKey(FLAGS.seed), trial)
                try:
                    result = polyphonic.train(
                        model,
                        data,
                        lr=hp["lr"],
                        momentum=hp["momentum"],
                        max_grad_norm=hp["max_grad_norm"],
                        batch_size=FLAGS.batch_size,
                        epochs=FLAGS.epochs,
                        key=key,
                        params=init_model.init(jax.random.fold_in(key, 1)),
                        max_steps=FLAGS.max_steps,
                    )
                except engine.Interrupted as e:
                    print(f"stopped by signal {e.signum} in trial {trial} ({LABELS[arch]}, depth "
                          f"{depth}); {len(rows)} finished trials are in {results_path}; rerun "
                          "with the same --workdir to continue", flush=True)  # fmt: skip
                    raise
                row = dict(
                    arch=arch,
                    depth=depth,
                    trial=trial,
                    hidden=n,
                    params=sizes[arch, depth]["params"],
                    **hp,
                    valid_nll=result.best_valid,
                    test_nll=result.test_at_best,
                    best_epoch=result.best_epoch,
                    epochs_run=result.epochs_run,
                    diverged=result.diverged,
                    seconds=round(result.seconds, 2),
                )
                rows.append(row)
                with open(results_path, "a") as f:
                    f.write(json.dumps(engine.strict(row)) + "\n")  # inf/nan as null
                print(
                    f"[{len(rows):4d}/{total}] {LABELS[arch]:>9} d{depth} t{trial}: "
                    f"lr {hp['lr']:.3g} mom {hp['momentum']:.3f} clip {hp['max_grad_norm']:.3g} "
                    f"scale {hp['init_scale']:.3g}"
                    + (f" bias {hp['init_bias']:.2f}" if "init_bias" in cells.options(arch) else "")
                    + f" -> valid {result.best_valid:.3f} test {result.test_at_best:.3f} "
                    f"(epoch {result.best_epoch}{', diverged' if result.diverged else ''}) "
                    f"{result.seconds:.1f} s | {time.perf_counter() - start:.0f} s",
                    flush=True,
                )
    rows = [r for r in rows if r["arch"] in archs and r["depth"] in depths]
    table = summarise(rows, archs, depths, sizes)
    (workdir / "results.md").write_text(
        "# JSB Chorales optimisation study (Zilly et al. 2017, Fig. 4)\n\n"
        f"Test NLL per time step in nats; target parameter count = RHN of width "
        f"{FLAGS.width}; {FLAGS.trials} trials x {FLAGS.epochs} epochs, batch "
        f"{FLAGS.batch_size}, seed {FLAGS.seed}.\n\n" + table + "\n"
    )
    swarm_plot(rows, archs, depths, workdir / "jsb_swarm.png")
    print(table)
    print(f"wrote {workdir / 'results.md'}, {workdir / 'jsb_swarm.png'}, {results_path}")
    print(f"total {time.perf_counter() - start:.0f} s")


def main(argv) -> None:
    del argv
    cli.main(study)


if __name__ == "__main__":
    cli.run_app(main)
