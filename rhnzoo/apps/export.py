"""``experiments/export.py``'s flags and body: a trained run's model as a ``jax.export``
artifact that runs without rhnzoo (:mod:`rhnzoo.models.export`).

A language-model run (``ptb.py``, ``char.py``) gives its window ``forward`` and its
one-token ``step`` (with ``vocab.json``, the run's vocabulary, where its data set is on
disk); a sequence-classifier run (``rrl.py``) its ``logits``. The parameters are the
run's best (``best/``, else the latest checkpoint).
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
from absl import flags

from rhnzoo import data, precision
from rhnzoo.apps import cli
from rhnzoo.analysis import lm as lm_analysis
from rhnzoo.analysis import report
from rhnzoo.configs import rrl as rrl_configs
from rhnzoo.engine import workdir as workdir_lib
from rhnzoo.models import export

FLAGS = flags.FLAGS
# The platforms jax.export lowers for (its built-in ones; jax/_src/export/_export.py).
KNOWN_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def define_flags() -> None:
    """Defines the script's flags (call once, at import of the script)."""
    flags.DEFINE_string("workdir", None, "A trained run (ptb.py, char.py or rrl.py).")
    flags.DEFINE_string("out", None, "Directory of the artifact (default: <workdir>/export).")
    flags.DEFINE_list(
        "platforms",
        list(export.PLATFORMS),
        "Platforms to lower for (jax.export names); the CPU alone where that fails.",
    )
    flags.DEFINE_string(
        "data_dir", None, "Where the run's data set is, for vocab.json (default: the run's)."
    )


def export_run(
    workdir: pathlib.Path, out: pathlib.Path, platforms=export.PLATFORMS, data_dir=None
) -> dict:
    """Exports the run in ``workdir`` into ``out``; returns the manifest.

    Raises:
      ValueError: (one line) no ``config.json``, a run without a checkpoint, a
        feed-forward run, a checkpoint that does not fit its config.
    """
    config = workdir_lib.read_config(workdir)
    kind = report.run_kind(config)
    about = {"workdir": str(workdir), "dataset": config.get("dataset")}
    if kind == "lm":
        model, params, config = lm_analysis.load_run(workdir)
        with precision.context(config.get("matmul_precision", "default")):
            manifest = export.export_language_model(
                model, params, out, platforms=platforms, description=about
            )
        try:  # the vocabulary, where the data set is on disk
            corpus = data.load(
                config.get("dataset", "ptb"),
                data_dir or config.get("data_dir"),
                download=False,
                verify=False,
            )
        except data.DataError:
            return manifest
        if corpus.vocab_size == model.vocab_size:
            (out / "vocab.json").write_text(json.dumps(list(corpus.vocab)) + "\n")
        return manifest
    if kind == "sequences":
        params = workdir_lib.restore_params(workdir)
        if params is None:
            raise ValueError(f"{workdir} has no checkpoint (best/ or checkpoints/); train it first")
        params = jax.tree.map(jnp.asarray, params)
        embed, settings = params.get("embed"), rrl_configs.RRLConfig.from_dict(config)
        classes = int(params["W_out"].shape[1])
        if embed is None:  # features per step (P-MNIST)
            model = settings.classifier(classes, data.DATASETS[config["dataset"]].input_size)
        else:
            model = settings.classifier(classes, int(embed.shape[1]), int(embed.shape[0]))
        with precision.context(config.get("matmul_precision", "default")):
            return export.export_classifier(
                model, params, out, platforms=platforms, description=about
            )
    raise ValueError(
        f"{workdir} is a feed-forward run ({config.get('dataset')}); export.py exports "
        "language models and sequence classifiers"
    )


def run() -> None:
    """The script's body: the flags -> :func:`export_run` -> one line naming the artifact."""
    if not FLAGS.workdir:
        raise ValueError("--workdir is required (a trained ptb.py, char.py or rrl.py run)")
    unknown = [p for p in FLAGS.platforms if p not in KNOWN_PLATFORMS]
    if unknown or not FLAGS.platforms:
        raise ValueError(
            f"--platforms={','.join(FLAGS.platforms)}: "
            + (f"unknown platform {', '.join(unknown)}; " if unknown else "none given; ")
            + f"jax.export lowers for {', '.join(KNOWN_PLATFORMS)}"
        )
    workdir = pathlib.Path(FLAGS.workdir)
    out = pathlib.Path(FLAGS.out) if FLAGS.out else workdir / "export"
    cli.check_out(out)
    manifest = export_run(workdir, out, tuple(FLAGS.platforms), FLAGS.data_dir)
    note = f" ({manifest['platforms_note']})" if manifest["platforms_note"] else ""
    print(
        f"exported {', '.join(manifest['functions'])} of {workdir} to {out} for "
        f"{', '.join(manifest['platforms'])}{note}; load it with {out / 'exported.py'}"
    )
