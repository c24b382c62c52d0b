"""The language-model experiments (``experiments/ptb.py``, ``experiments/char.py``): the
flags, generated from :class:`~rhnzoo.configs.lm.LMConfig`, -> one config (presets:
:mod:`rhnzoo.configs.lm`) -> data -> :func:`rhnzoo.tasks.lm.train_and_evaluate` ->
the run's ``learning_curves.png`` (:func:`rhnzoo.apps.cli.write_learning_curves`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from absl import flags

from rhnzoo import cells, data
from rhnzoo.apps import cli
from rhnzoo.configs import lm as lm_configs
from rhnzoo.tasks import lm as lm_training
from rhnzoo.configs.lm import LMConfig

FLAGS = flags.FLAGS
_NAMES: list[str] = []  # the flags of LMConfig's fields


def define_flags(dataset: str, choices: list[str] | None = None) -> None:
    """Defines the language-model flags (call once, at import of the script): one per
    :class:`LMConfig` field, their defaults ``dataset``'s reference configuration
    (:func:`rhnzoo.configs.lm.defaults`), ``--preset`` from its presets, ``--epochs`` an
    alias of ``--max_max_epoch``; ``--dataset`` only with ``choices`` (its default
    ``dataset``)."""
    if choices:
        flags.DEFINE_enum("dataset", dataset, choices, "Data set.", module_name=__name__)
    presets = list(lm_configs.presets(dataset))
    _NAMES.extend(
        cli.define_config_flags(lm_configs.defaults(dataset), presets, module_name=__name__)
    )
    flags.DEFINE_alias("epochs", "max_max_epoch", module_name=__name__)


def config(dataset: str | None = None, **overrides: Any) -> LMConfig:
    """The flags of data set ``dataset`` (None: ``--dataset``) as one :class:`LMConfig`
    (checked; ``to_dict()`` is ``config.json``): ``--preset``'s settings, then the flags
    given, then ``overrides`` (e.g. a sweep run's ``depth``, ``hsg``, ``workdir``). With
    HSG the RHN's T bias defaults to -2.5 (Shoham & Permuter; the config's rule). A preset
    made for one data set (:data:`rhnzoo.configs.lm.CHAR_PRESET_DATASETS`: ``small`` is
    PTB-char's) implies it where ``--dataset`` is not given.

    Raises:
      ValueError: (one line) a bad setting (:class:`LMConfig`'s checks: a cell flag
        given to a cell without it, ``--hsg_init_bias`` without ``--hsg``...);
        ``--max_epoch`` given past the schedule's ``--max_max_epoch`` (a flag that would
        do nothing); a preset given with another data set than its own.
    """
    given = cli.given(_NAMES)
    settings = {**given, **overrides}
    cfg = lm_configs.get_config(FLAGS.preset, dataset or _dataset(FLAGS.preset), **settings)
    if "max_epoch" in given and cfg.max_epoch > cfg.max_max_epoch:
        raise ValueError(
            f"--max_epoch={cfg.max_epoch} (epochs at the initial learning rate) "
            f"exceeds --max_max_epoch={cfg.max_max_epoch} (the schedule's epochs): "
            "the learning rate would never decay"
        )
    return cfg


def _dataset(preset: str | None) -> str:
    """``--dataset``, or the data set ``preset`` is made for where ``--dataset`` is not
    given. Raises ValueError (one line) for a preset given with another data set."""
    own = lm_configs.CHAR_PRESET_DATASETS.get(preset)
    if own is None or own == FLAGS.dataset:
        return FLAGS.dataset
    if FLAGS["dataset"].present:
        raise ValueError(
            f"--preset={preset} is sized for --dataset={own}, not "
            f"--dataset={FLAGS.dataset}; leave --preset out (and set the sizes) "
            "for another data set"
        )
    return own


def check_fits(cfg: LMConfig) -> None:
    """Refuses (:func:`rhnzoo.apps.cli.check_fits`: one line) a model of ``cfg`` whose
    parameters and optimizer state cannot fit a device, before the data are read: sized
    at a vocabulary of 2 symbols, a lower bound of any corpus's model."""

    def state():
        return lm_training.init_state(
            cfg.model(2), cfg, lm_training.make_optimizer(cfg, 1), jax.random.PRNGKey(0)
        )

    depth = f", --depth={cfg.depth}" if "depth" in cells.options(cfg.cell) else ""
    cli.check_fits(state, f"--hidden_size={cfg.hidden_size}{depth}")


def run(dataset: str | None = None, load_corpus: Callable[..., Any] | None = None) -> None:
    """The language-model experiments' main: the flags as one config (:func:`config`,
    checked, and its size (:func:`check_fits`), before any data is read) -> data ->
    :func:`~rhnzoo.tasks.lm.train_and_evaluate`
    -> the run's learning curves (:func:`rhnzoo.apps.cli.write_learning_curves`).

    Args:
      dataset: a registered language-model data set (``'ptb'``...; None: ``--dataset``);
        it gives the metric (perplexity or bits per character) and the default workdir.
      load_corpus: ``load_corpus(data_dir, download=..., verify=...) -> Corpus``
        (default: the data set's registered loader).
    """
    cfg = config(dataset)
    cli.initialize_distributed(cfg)
    cli.note_interpreted_kernels(cfg.scan_impl)
    check_fits(cfg)
    load = load_corpus or data.DATASETS[cfg.dataset].load
    corpus = load(cfg.data_dir, download=cfg.download, verify=cfg.verify_data)
    lm_training.train_and_evaluate(cfg, corpus)
    cli.write_learning_curves(cfg.run_dir, f"valid_{cfg.metric}", f"train_{cfg.metric}")
