"""``experiments/generate.py``'s flags and body: text from a trained language model
(:func:`load`), its tokens from :mod:`rhnzoo.models.generate` (greedy or sampled, at the
run's recorded matmul precision), drawn in chunks of :data:`CHUNK` tokens under a progress
bar, then printed.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from rhnzoo import data, precision
from rhnzoo.analysis import lm as lm_analysis
from rhnzoo.analysis import report
from rhnzoo.configs import lm as lm_configs
from rhnzoo.engine import signals
from rhnzoo.engine import workdir as workdir_lib
from rhnzoo.models import generate

FLAGS = flags.FLAGS
CHUNK = 100  # tokens per compiled decode call (one tick of the progress bar)
# The most --samples: the rows of one batch, each holding the state and a vocabulary's
# logits per step (10,000 rows of a 10,000-word vocabulary: 400 MB of logits).
MAX_SAMPLES = 10_000


def define_flags() -> None:
    """Defines the script's flags (call once, at import of the script)."""
    flags.DEFINE_string("workdir", None, "A trained language-model run (ptb.py, char.py).")
    flags.DEFINE_integer("num_tokens", 200, "Tokens to generate after the prompt.", lower_bound=1)
    flags.DEFINE_string(
        "prompt",
        "",
        "Text to start from (words of the run's vocabulary, or characters); empty: the "
        "end-of-sentence symbol.",
    )
    flags.DEFINE_boolean("greedy", False, "Take the likeliest token at every step.")
    flags.DEFINE_float("temperature", 1.0, "Sampling temperature (> 0).")
    flags.DEFINE_integer("top_k", None, "Sample among the k likeliest tokens (default: all).")
    flags.DEFINE_integer("seed", 0, "Seed of the sampling key.")
    flags.DEFINE_integer(
        "samples",
        1,
        f"Texts to generate (rows of one batch), at most {MAX_SAMPLES:,}.",
        lower_bound=1,
        upper_bound=MAX_SAMPLES,
    )
    flags.DEFINE_string(
        "data_dir", None, "Where the run's data set is (default: the run's --data_dir)."
    )
    flags.DEFINE_boolean("progress", True, "A progress bar over long outputs.")


def load(workdir: pathlib.Path, data_dir: str | None = None):
    """``(model, params, config, vocab)`` of a trained language-model run: its best
    parameters (:func:`rhnzoo.analysis.lm.load_run`: ``best/``, else the latest checkpoint),
    its vocabulary from the run's data set (``config.json``'s ``dataset`` and ``data_dir``,
    or ``data_dir``; read, never downloaded).

    Raises:
      ValueError: (one line) a missing or empty workdir (no ``config.json``), a run of
        another task, no checkpoint, a checkpoint that does not fit its config, data
        whose vocabulary is not the run's.
      rhnzoo.data.DataError: the run's data set is not on disk.
    """
    config = workdir_lib.read_config(workdir)
    kind = report.run_kind(config)
    if kind != "lm":
        raise ValueError(
            f"{workdir} is a run on {config.get('dataset')} (task {kind!r}), not a language model: "
            "generate.py reads runs of ptb.py or char.py"
        )
    model, params, config = lm_analysis.load_run(workdir)
    dataset = config.get("dataset", "ptb")
    corpus = data.load(dataset, data_dir or config.get("data_dir"), download=False, verify=False)
    if corpus.vocab_size != model.vocab_size:
        raise ValueError(
            f"the run has a {model.vocab_size}-symbol vocabulary but the data in "
            f"{data_dir or config.get('data_dir') or '$RHNZOO_DATA'} has "
            f"{corpus.vocab_size}; pass the run's --data_dir"
        )
    return model, params, config, corpus.vocab


def run() -> None:
    """The script's body: the flags -> the run's model -> ``--samples`` texts on stdout."""
    if not FLAGS.workdir:
        raise ValueError("--workdir is required (a trained ptb.py or char.py run)")
    if not FLAGS.greedy and not FLAGS.temperature > 0:
        raise ValueError(f"--temperature must be > 0, got {FLAGS.temperature}")
    workdir = pathlib.Path(FLAGS.workdir)
    model, params, config, vocab = load(workdir, FLAGS.data_dir)
    if FLAGS.top_k is not None and not 1 <= FLAGS.top_k <= len(vocab):
        raise ValueError(
            f"--top_k must be in [1, {len(vocab)}] (the vocabulary), got {FLAGS.top_k}"
        )
    dataset = config.get("dataset", "ptb")
    text = dict(
        char_level=lm_configs.char_level(dataset), space="_" if dataset == "ptb_char" else " "
    )
    prompt = generate.encode(FLAGS.prompt, vocab, **text)
    rows = jnp.asarray(np.repeat(prompt[None], FLAGS.samples, axis=0))
    key = jax.random.PRNGKey(FLAGS.seed)
    options = dict(key=key, temperature=FLAGS.temperature, top_k=FLAGS.top_k, greedy=FLAGS.greedy)
    chunks = [min(CHUNK, FLAGS.num_tokens - s) for s in range(0, FLAGS.num_tokens, CHUNK)]
    out = []
    with precision.context(config.get("matmul_precision", "default")):
        state = generate.prime(model, params, rows)
        progress = FLAGS.progress and len(chunks) > 1
        for n in signals.track(chunks, desc="generating", progress=progress):
            tokens, state = generate.decode(model, params, state, n, **options)
            out.append(np.asarray(tokens))
    tokens = np.concatenate(out, axis=1)
    shown = generate.render(prompt, vocab, **text) if FLAGS.prompt else ""
    for i, row in enumerate(tokens):
        if FLAGS.samples > 1:
            print(f"--- sample {i + 1}")
        print(
            shown
            + (" " * (bool(shown) and not text["char_level"]))
            + generate.render(row, vocab, **text)
        )
