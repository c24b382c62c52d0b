r"""Feed-forward Highway Networks vs plain nets at depths 10-100 (Srivastava et al. 2015).

  python experiments/highway.py --preset=cpu --sweep       # 2-core CPU: the whole sweep
  python experiments/highway.py --sweep                    # the papers' 400 epochs
  python experiments/highway.py --depth=50 --transform_bias=-2   # one net, + its figures
  python experiments/highway.py --kind=plain --depth=20 --activation=relu --init=he_normal

Nets: the flattened image, a plain layer to the width (50 for highway, 71 for
plain: about 5,000 parameters per layer either way), ``depth - 1`` highway or
plain layers, a softmax output; SGD with momentum 0.9, learning rate decayed by
0.96 every 100,000 steps, batches of 128 (the ECBM4040 reproduction). Highway
nets use --lr (0.1); plain nets use --plain_lrs at their depth unless --lr is
given (the reproduction: 1e-3 at depths 10 and 20, 1e-5 at 50 and 100). The last
--valid_size training images are held out; validation picks the epoch whose
parameters are tested.

A single run writes ``<workdir>/{config.json, metrics.jsonl, results.json}`` and,
for a highway net, ``gate_heatmaps.png`` and ``lesion.png``. ``--sweep`` trains
every depth in --depths x (plain, highway), each in ``<workdir>/<kind>_d<depth>``
(finished runs are skipped, interrupted ones resume), then writes into the
sweep's workdir ``results.md`` (table), ``training_curves.png``,
``gate_heatmaps_d<depth>.png``, ``lesion_d<depth>.png``,
``plain_diagnostics.png`` and ``analysis.json``. With ``--jobs=N`` the sweep's runs
train N at a time in child processes; with ``--seeds=K`` each (kind, depth) trains with
seeds --seed ... --seed+K-1 (seed k > 0 in ``<kind>_d<depth>_s<k>``) and the table
shows mean ± sd.
"""

from __future__ import annotations

import sys
import types

from absl import flags

from rhnzoo import cli, data, precision
from rhnzoo.training import sweep

DATASETS = data.names("images")  # mnist, cifar100 (rhnzoo.data registry: sizes, loader)
PRESETS = {
    # The whole MNIST sweep (4 depths x 2 kinds, 8 x 120 epochs) on 2 CPU cores in about
    # 35 minutes (36.1 measured, shared cores); measured results in BUILD_NOTES.md.
    # T bias -4 as for the papers' depth curves; the plain rates are the reproduction's.
    "cpu": dict(epochs=120, transform_bias=-4.0,
                plain_lrs=["10:1e-3", "20:1e-3", "50:1e-5", "100:1e-5"]),
}

cli.define_presets(PRESETS)
cli.define_run_flags()
flags.DEFINE_enum("kind", "highway", ["highway", "plain"], "Net.")
flags.DEFINE_integer("depth", 10, "Hidden layers in all (>= 2): the first plain layer and "
                     "depth - 1 highway or plain layers.")
flags.DEFINE_integer("width", None, "Units per layer (default 50 for highway, 71 for plain).")
flags.DEFINE_enum("dataset", "mnist", list(DATASETS), "Data set.")
flags.DEFINE_enum("data_source", "files", ["files", "tfds"], "The original idx / python "
                  "pickle files, or TensorFlow Datasets (pip install 'rhnzoo[tfds]').")
flags.DEFINE_enum("activation", "tanh", ["tanh", "relu", "sigmoid"], "H and plain-layer "
                  "nonlinearity.")
flags.DEFINE_enum("init", "glorot_uniform", ["glorot_uniform", "he_normal"], "Weight "
                  "initialisation.")
flags.DEFINE_float("transform_bias", -4.0, "Initial transform-gate bias b_T (papers: -1 to "
                   "-10; -2 for the MNIST heatmaps, -4 for the depth curves).")
flags.DEFINE_float("lr", None, "Initial learning rate (default: 0.1 for highway nets, "
                   "--plain_lrs at the depth for plain nets).")
flags.DEFINE_list("plain_lrs", ["10:1e-3", "20:1e-3", "50:1e-5", "100:1e-5"],
                  "depth:rate pairs, the plain nets' learning rates when --lr is not given.")
flags.DEFINE_float("momentum", 0.9, "SGD momentum.")
flags.DEFINE_float("lr_decay_rate", 0.96, "Learning-rate factor every --lr_decay_steps.")
flags.DEFINE_integer("lr_decay_steps", 100_000, "Steps between learning-rate decays.")
flags.DEFINE_integer("batch_size", 128, "Images per SGD step.")
flags.DEFINE_integer("eval_batch_size", 1000, "Images per evaluation call.")
flags.DEFINE_integer("epochs", 400, "Training epochs (the papers: 400).")
flags.DEFINE_integer("valid_size", 10000, "Last training images held out for validation.")
flags.DEFINE_boolean("sweep", False, "Train every --depths x (plain, highway), then write the "
                     "table and figures.")
flags.DEFINE_list("depths", ["10", "20", "50", "100"], "Depths of --sweep.")
flags.DEFINE_boolean("analyze", True, "After training a highway net, write its gate heatmaps "
                     "and lesioning figure.")
flags.DEFINE_integer("heatmap_examples", 10000, "Training images averaged in the mean-T heatmap.")
flags.DEFINE_integer("lesion_examples", 10000, "Training images of the lesioning study.")
flags.DEFINE_integer("diagnostics_depth", 50, "Depth of the plain nets of the sweep's "
                     "activation / gradient diagnostics (0: skip).")
sweep.define_flags()
flags.adopt_module_key_flags(cli)
flags.adopt_module_key_flags(sweep)
FLAGS = flags.FLAGS

def experiment() -> None:
    from rhnzoo.training import highway_experiment

    cli.apply_preset()
    jobs, seeds = sweep.from_flags()
    F = types.SimpleNamespace(**{name: FLAGS[name].value for name in FLAGS})  # every flag
    with precision.context(FLAGS.matmul_precision):  # the figures' evaluations too
        highway_experiment.experiment(F, cli.run_config(FLAGS.epochs), jobs, seeds)


def main(argv) -> None:
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {' '.join(argv[1:])}")
    cli.main(experiment)


if __name__ == "__main__":
    cli.run_app(main)
