r"""Recurrent Residual Learning for sequence classification (Wang & Tian, EMNLP 2016).

  python experiments/rrl.py --dataset=imdb --model=sc_lstm_i --preset=cpu   # 2-core CPU
  python experiments/rrl.py --dataset=pmnist --model=hrl --preset=cpu
  python experiments/rrl.py --dataset=imdb --preset=paper --model=hrl       # Table 2 sizes
  python experiments/rrl.py --dataset=imdb --preset=cpu --table             # Table 3 layout

Models: LSTM and GRU baselines, RRN (residual recurrent network, eqs. 3-4), SC-LSTM-I /
SC-LSTM-P (skip connections every --skip steps, identity / learned α, eq. 5), HRL (LSTM
and RRN side by side, eqs. 6-7) and LSTM + GRU. Embedding (learned; --embeddings=PATH
loads word2vec vectors) or the raw pixel (P-MNIST) -> one recurrent layer -> final state
-> dropout -> softmax; Adadelta with gradient clipping; 15 % of the training set is the
dev set (model selection, --patience early stopping); test accuracy at the best dev epoch.

Each model trains in ``<root>/<model>`` (root: --workdir, default
runs/rrl_<dataset>_<preset>); rerunning resumes. ``--table`` runs the --models not yet
finished there, then prints Table 3's layout with the measured accuracies.
"""

import json
import pathlib

from absl import flags

from rhnzoo import cli
from rhnzoo.training import engine, rrl

# Wang & Tian Table 2: embedding x hidden (hybrids: hidden per cell).
PAPER = {
    "imdb": dict(embed_size=256, hidden_size=512, hybrid_hidden_size=384),
    "agnews": dict(embed_size=256, hidden_size=512, hybrid_hidden_size=384),
    "20ng": dict(embed_size=500, hidden_size=768, hybrid_hidden_size=512),
    "pmnist": dict(embed_size=1, hidden_size=100, hybrid_hidden_size=80, max_len=784,
                   buckets=1),
}  # fmt: skip
# 2-core CPU, about 15-30 minutes per model (measured times in README / BUILD_NOTES.md):
# smaller widths than Table 2, the last 400 steps of a review, fewer epochs.
CPU = {
    "imdb": dict(embed_size=64, hidden_size=128, hybrid_hidden_size=96, max_len=400,
                 epochs=10, patience=3, batch_size=32),
    "agnews": dict(embed_size=64, hidden_size=128, hybrid_hidden_size=96, max_len=64,
                   epochs=3, batch_size=64),
    "20ng": dict(embed_size=64, hidden_size=128, hybrid_hidden_size=96, max_len=400,
                 epochs=10, patience=3, batch_size=32),
    "pmnist": dict(embed_size=1, hidden_size=64, hybrid_hidden_size=48, max_len=784,
                   buckets=1, epochs=8, batch_size=100),
}  # fmt: skip
# Wang & Tian Table 3 (test accuracy, %): not available offline when this was written;
# fill in {(model, dataset): accuracy} from the paper to print it beside ours.
PAPER_TABLE3: dict[tuple[str, str], float] = {}

flags.DEFINE_enum("dataset", "imdb", list(rrl.DATASETS), "Data set.")
flags.DEFINE_enum("model", "lstm", list(rrl.MODELS), "Recurrent layer.")
flags.DEFINE_list("models", list(rrl.MODELS), "With --table: the models of the table.")
flags.DEFINE_boolean("table", False, "Train the --models not finished under the root, then "
                     "print the Table 3 layout (--norun_missing: only print).")
flags.DEFINE_boolean("run_missing", True, "With --table: train models without results.")
flags.DEFINE_enum("data_source", "files", ["files", "tfds"], "Original files (download, "
                  "checksum, cache) or TensorFlow Datasets (pip install 'rhnzoo[tfds]').")
flags.DEFINE_integer("embed_size", 256, "Embedding width (P-MNIST: 1, the pixel).")
flags.DEFINE_integer("hidden_size", 512, "Hidden units (LSTM, GRU, RRN, SC-LSTM).")
flags.DEFINE_integer("hybrid_hidden_size", 384, "Hidden units per cell of HRL / LSTM+GRU.")
flags.DEFINE_integer("rrn_depth", 2, "K, layers of the RRN transition F (eq. 4).")
flags.DEFINE_enum("rrn_activation", "sigmoid", ["sigmoid", "tanh"], "Inner activation of the "
                  "RRN transition (the paper's σ is the logistic function).")
flags.DEFINE_integer("skip", 20, "SC-LSTM skip length L (eq. 5).")
flags.DEFINE_float("forget_bias", 1.0, "Initial LSTM forget-gate bias.")
flags.DEFINE_float("init_scale", 0.1, "Uniform initialisation half-width.")
flags.DEFINE_float("drop", 0.5, "Dropout probability on the final representation.")
flags.DEFINE_integer("batch_size", 32, "Sequences per step.")
flags.DEFINE_integer("max_len", 400, "Steps kept per sequence.")
flags.DEFINE_enum("keep", "last", ["last", "first"], "Which steps a longer sequence keeps.")
flags.DEFINE_integer("buckets", 4, "Padded lengths: max_len / 2^k, k < buckets.")
flags.DEFINE_float("lr", 1.0, "Adadelta learning rate.")
flags.DEFINE_float("max_grad_norm", 5.0, "Global-norm gradient clipping.")
flags.DEFINE_integer("epochs", 10, "Epochs.")
flags.DEFINE_float("coverage", 0.95, "Vocabulary: most frequent words covering this fraction "
                   "of the training tokens; the rest is <unk>.")
flags.DEFINE_integer("dev_seed", 0, "Seed of the 15 % dev split.")
flags.DEFINE_boolean("permute", True, "P-MNIST: the fixed pixel permutation (--nopermute: "
                     "sequential MNIST).")
flags.DEFINE_string("embeddings", None, "word2vec vectors (text, or binary if *.bin) to "
                    "initialise the embedding; the paper's were trained on Wikipedia.")
cli.define_presets({"paper": {}, "cpu": {}})
cli.define_run_flags()
flags.adopt_module_key_flags(cli)
FLAGS = flags.FLAGS
MODEL_FLAGS = ("dataset", "embed_size", "hidden_size", "hybrid_hidden_size", "rrn_depth",
               "rrn_activation", "skip", "forget_bias", "init_scale", "drop", "batch_size",
               "max_len", "keep", "buckets", "lr", "max_grad_norm", "epochs", "coverage", "dev_seed",
               "permute", "embeddings", "data_source")  # fmt: skip


def root() -> pathlib.Path:
    return pathlib.Path(FLAGS.workdir or f"runs/rrl_{FLAGS.dataset}_{FLAGS.preset or 'custom'}")


def make_cell(name: str):
    return rrl.make_cell(name, FLAGS.hidden_size, FLAGS.hybrid_hidden_size,
                         rrn_depth=FLAGS.rrn_depth, rrn_activation=FLAGS.rrn_activation,
                         skip=FLAGS.skip, forget_bias=FLAGS.forget_bias,
                         init_scale=FLAGS.init_scale)  # fmt: skip


def train(dataset: rrl.Dataset, name: str, cell, cfg: rrl.TrainConfig,
          run: engine.RunConfig) -> dict:  # fmt: skip
    from rhnzoo.data.word2vec import load_word2vec
    from rhnzoo.models.classifier import SequenceClassifier

    vocab = dataset.vocab
    model = SequenceClassifier(cell, dataset.num_classes, dataset.input_size or FLAGS.embed_size,
                               None if vocab is None else len(vocab), drop=FLAGS.drop,
                               init_scale=FLAGS.init_scale)  # fmt: skip
    vectors = None
    if FLAGS.embeddings and vocab is not None:
        vectors = load_word2vec(FLAGS.embeddings, vocab, FLAGS.embed_size)
        print(f"{FLAGS.embeddings}: vectors for {vectors[1].sum():,} of {len(vocab):,} words")
    task = rrl.make_task(model, dataset.train, dataset.dev, dataset.test, cfg, FLAGS.seed,
                         vectors)  # fmt: skip
    config = {"model": name, **{k: FLAGS[k].value for k in MODEL_FLAGS},
              **{k: FLAGS[k].value for k in cli.RUN_FLAGS + cli.DATA_FLAGS}}  # fmt: skip
    print(f"{rrl.LABELS[name]} on {FLAGS.dataset}: {len(dataset.train.labels):,} train / "
          f"{len(dataset.dev.labels):,} dev / {len(dataset.test.labels):,} test sequences")
    return engine.run(task, run, root() / name, config).results


def table(models) -> str:
    """Table 3's layout: one row per model, our dev and test accuracy beside the paper's."""
    lines = [f"| model ({FLAGS.dataset}, preset {FLAGS.preset or 'custom'}) | paper test acc | "
             "rhnzoo dev acc | rhnzoo test acc | parameters | epochs | minutes |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name in models:
        path = root() / name / "results.json"
        r = json.loads(path.read_text()) if path.is_file() else None
        metrics = engine.read_metrics(root() / name)
        paper = PAPER_TABLE3.get((name, FLAGS.dataset))
        cells = [f"{100 * r['dev_acc']:.2f}", f"{100 * r['test_acc']:.2f}",
                 f"{r['parameters']:,}", str(len(metrics)),
                 f"{metrics[-1]['elapsed_s'] / 60:.1f}" if metrics else "—"] if r else ["—"] * 5  # fmt: skip
        lines.append(f"| {rrl.LABELS[name]} | {paper if paper is not None else 'n/a'} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def experiment() -> None:
    cli.apply_preset({"paper": PAPER, "cpu": CPU}.get(FLAGS.preset, {}).get(FLAGS.dataset, {}))
    if FLAGS.dataset == "pmnist" and not FLAGS["embed_size"].present:
        FLAGS.embed_size = 1
    models = list(dict.fromkeys(FLAGS.models if FLAGS.table else [FLAGS.model]))
    unknown = [m for m in models if m not in rrl.MODELS]
    if unknown:
        raise ValueError(f"--models: unknown {unknown}; choose from {', '.join(rrl.MODELS)}")
    # Every setting is validated before the data are loaded.
    cell_of = {name: make_cell(name) for name in models}
    cfg = rrl.TrainConfig(batch_size=FLAGS.batch_size, max_len=FLAGS.max_len, keep=FLAGS.keep,
                          buckets=FLAGS.buckets, lr=FLAGS.lr, max_grad_norm=FLAGS.max_grad_norm,
                          epochs=FLAGS.epochs)  # fmt: skip
    run = cli.run_config(FLAGS.epochs)
    todo = [m for m in models if not (root() / m / "results.json").is_file()]
    if todo and (FLAGS.run_missing or not FLAGS.table):
        dataset = rrl.load_dataset(
            FLAGS.dataset, data_dir=FLAGS.data_dir, download=FLAGS.download,
            verify=FLAGS.verify_data, source=FLAGS.data_source, coverage=FLAGS.coverage,
            dev_seed=FLAGS.dev_seed, permute=FLAGS.permute,
        )  # fmt: skip
        for name in models if not FLAGS.table else todo:
            train(dataset, name, cell_of[name], cfg, run)
    if FLAGS.table:
        text = table(models)
        (root() / "table.md").parent.mkdir(parents=True, exist_ok=True)
        (root() / "table.md").write_text(text + "\n")
        print(text)


def main(argv):
    del argv
    cli.main(experiment)


if __name__ == "__main__":
    cli.run_app(main)
