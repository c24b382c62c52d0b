r"""Word-level Penn Treebank with a (Highway-State-Gated) Recurrent Highway Network.

  python experiments/ptb.py --depth=40 --hsg          # Shoham & Permuter, Table 1
  python experiments/ptb.py --nohsg --depth=10        # Zilly et al., 65.4 test ppl
  python experiments/ptb.py --preset=small            # 2-core CPU, under an hour

Defaults are the reference code's ``ptb_sota`` configuration. Rerunning with the
same ``--workdir`` resumes; results land in ``<workdir>/results.json``.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

from rhnzoo import cells, data, dropout, lm, train

PRESETS = {
    # Small enough for a 2-core CPU; see BUILD_NOTES.md for its measured result.
    "small": dict(
        hidden_size=256,
        depth=3,
        lr=1.0,
        max_epoch=4,
        lr_decay=2.0,
        max_max_epoch=8,
        drop_x=0.1,
        drop_i=0.3,
        drop_h=0.1,
        drop_o=0.3,
        eval_num_steps=200,
    ),
}

flags.DEFINE_enum(
    "preset",
    None,
    list(PRESETS),
    "Named setting overriding the defaults (flags given explicitly still win).",
)
flags.DEFINE_integer("depth", 10, "Recurrence depth L (micro-layers per time step).")
flags.DEFINE_integer("hidden_size", 830, "Units per micro-layer.")
flags.DEFINE_boolean("hsg", False, "Add the Highway State Gate (Shoham & Permuter).")
flags.DEFINE_float("hsg_init_bias", -2.5, "Initial HSG gate bias b_G.")
flags.DEFINE_boolean("coupled", True, "Coupled carry gate C = 1 - T.")
flags.DEFINE_boolean("tied", True, "Tie the embedding and softmax weights.")
flags.DEFINE_float("init_scale", 0.04, "Uniform initialisation half-width.")
flags.DEFINE_float("init_bias", -2.0, "Initial transform-gate bias.")
flags.DEFINE_float("lr", 0.2, "Initial SGD learning rate (loss summed over time / batch).")
flags.DEFINE_float("lr_decay", 1.02, "Learning-rate divisor per epoch after max_epoch.")
flags.DEFINE_integer("max_epoch", 20, "Epochs at constant learning rate.")
flags.DEFINE_integer("max_max_epoch", 500, "Total epochs.")
flags.DEFINE_float("weight_decay", 1e-7, "L2 coefficient.")
flags.DEFINE_float("max_grad_norm", 10.0, "Global-norm gradient clipping.")
flags.DEFINE_integer("num_steps", 35, "Truncated-BPTT window length.")
flags.DEFINE_integer("batch_size", 20, "Batch size (rows of the token stream).")
flags.DEFINE_float("drop_x", 0.25, "Word-dropout probability on the embedding.")
flags.DEFINE_float("drop_i", 0.75, "Dropout probability on the cell input.")
flags.DEFINE_float("drop_h", 0.25, "Dropout probability on the recurrent state.")
flags.DEFINE_float("drop_o", 0.75, "Dropout probability on the cell output.")
flags.DEFINE_integer("unroll", 1, "Time steps per lax.scan iteration.")
flags.DEFINE_integer("seed", 0, "Random seed (initialisation and dropout).")
flags.DEFINE_string(
    "data_dir",
    None,
    "Directory with ptb.{train,valid,test}.txt "
    "(default: $RHNZOO_DATA/ptb, else the user cache; downloaded if absent).",
)
flags.DEFINE_boolean("download", True, "Download Mikolov's archive when the files are absent.")
flags.DEFINE_string("workdir", None, "Run directory (default: runs/ptb_<settings>).")
flags.DEFINE_integer("max_steps", None, "Stop after this many train steps.")
flags.DEFINE_integer("max_epochs", None, "Stop after this many epochs.")
flags.DEFINE_integer("checkpoint_every_steps", 0, "Also checkpoint every N steps.")
flags.DEFINE_integer("eval_batch_size", 1, "Final evaluation batch size (1: reference).")
flags.DEFINE_integer("eval_num_steps", 100, "Window length of evaluation scans.")
flags.DEFINE_integer("log_every", 100, "Steps between loss readouts.")
flags.DEFINE_boolean("progress", True, "Show a progress bar.")
FLAGS = flags.FLAGS


def apply_preset() -> None:
    for name, value in PRESETS.get(FLAGS.preset, {}).items():
        if not FLAGS[name].present:
            FLAGS[name].value = value


def main(argv) -> None:
    del argv
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    apply_preset()
    config = {f.name: f.value for f in FLAGS.get_key_flags_for_module(sys.argv[0])}
    try:
        cells.RHN(FLAGS.hidden_size, FLAGS.depth)  # validates depth and size before any work
        rates = dropout.Rates(FLAGS.drop_x, FLAGS.drop_i, FLAGS.drop_h, FLAGS.drop_o)
        cfg = train.TrainConfig(
            lr=FLAGS.lr,
            lr_decay=FLAGS.lr_decay,
            max_epoch=FLAGS.max_epoch,
            max_max_epoch=FLAGS.max_max_epoch,
            weight_decay=FLAGS.weight_decay,
            max_grad_norm=FLAGS.max_grad_norm,
            batch_size=FLAGS.batch_size,
            num_steps=FLAGS.num_steps,
            rates=rates,
            seed=FLAGS.seed,
            max_steps=FLAGS.max_steps,
            max_epochs=FLAGS.max_epochs,
            checkpoint_every_steps=FLAGS.checkpoint_every_steps,
            eval_batch_size=FLAGS.eval_batch_size,
            eval_num_steps=FLAGS.eval_num_steps,
            log_every=FLAGS.log_every,
            progress=FLAGS.progress,
        )
        corpus = data.load_ptb(FLAGS.data_dir, download=FLAGS.download)
        model = lm.rhn_language_model(
            corpus.vocab_size,
            FLAGS.hidden_size,
            FLAGS.depth,
            hsg=FLAGS.hsg,
            tied=FLAGS.tied,
            coupled=FLAGS.coupled,
            init_scale=FLAGS.init_scale,
            init_bias=FLAGS.init_bias,
            hsg_init_bias=FLAGS.hsg_init_bias,
            unroll=FLAGS.unroll,
        )
        workdir = FLAGS.workdir or (
            f"runs/ptb_{FLAGS.preset or 'sota'}_d{FLAGS.depth}"
            f"_n{FLAGS.hidden_size}{'_hsg' if FLAGS.hsg else ''}"
        )
        train.train(model, corpus, cfg, workdir, run_config=config)
    except (ValueError, data.DataError, train.TrainingDiverged) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    app.run(main)
