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

A single run writes ``<workdir>/{config.json, metrics.jsonl, results.json,
learning_curves.png}`` and, for a highway net, ``gate_heatmaps.png`` and ``lesion.png``. ``--sweep`` trains
every depth in --depths x (plain, highway), each in ``<workdir>/<kind>_d<depth>``
(finished runs are skipped, interrupted ones resume), then writes into the
sweep's workdir ``results.md`` (table), ``training_curves.png``,
``gate_heatmaps_d<depth>.png``, ``lesion_d<depth>.png``,
``plain_diagnostics.png`` and ``analysis.json``. With ``--jobs=N`` the sweep's runs
train N at a time in child processes; with ``--seeds=K`` each (kind, depth) trains with
seeds --seed ... --seed+K-1 (seed k > 0 in ``<kind>_d<depth>_s<k>``) and the table
shows mean ± sd.
"""

from absl import flags

from rhnzoo.apps import cli, highway, runner

# Presets: rhnzoo/configs/highway.py (--preset=cpu: the whole sweep on a 2-core CPU).
highway.define_flags()
flags.adopt_module_key_flags(highway)
flags.adopt_module_key_flags(runner)

if __name__ == "__main__":
    cli.run_app(highway.main)
