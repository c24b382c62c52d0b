"""``experiments/rrl.py``'s flags and body (Wang & Tian, EMNLP 2016): the flags,
generated from :class:`~rhnzoo.configs.rrl.RRLConfig`, -> one base config (presets:
:mod:`rhnzoo.configs.rrl`) -> one config per run (:func:`rhnzoo.configs.rrl.runs`) ->
:func:`rhnzoo.studies.rrl_table3.run_experiment`, with the data set loaded once, only
when a run trains.
"""

from __future__ import annotations

import functools
import pathlib

import jax
from absl import flags

from rhnzoo.apps import cli, runner
from rhnzoo.cells import registry
from rhnzoo.configs import rrl as presets
from rhnzoo.studies import rrl_table3
from rhnzoo.tasks import rrl
from rhnzoo.configs.rrl import RRLConfig

FLAGS = flags.FLAGS
_NAMES: list[str] = []  # the flags of RRLConfig's fields


def define_flags() -> None:
    """Defines the script's flags (call once, at import of the script): one per
    :class:`RRLConfig` field (``--model`` among them), their defaults the config's,
    ``--preset``; the script's own ``--models``, ``--table``, ``--study``,
    ``--run_missing``; the sweep runner's (:func:`rhnzoo.apps.runner.define_flags`)."""
    _NAMES.extend(
        cli.define_config_flags(presets.get_config(), list(presets.PRESETS), module_name=__name__)
    )
    flags.DEFINE_list(
        "models",
        list(presets.MODELS),
        "With --table: the models of the table.",
        module_name=__name__,
    )
    flags.DEFINE_boolean(
        "table",
        False,
        "Train the --models not finished under the root, then print the Table 3 layout "
        "(--norun_missing: only print).",
        module_name=__name__,
    )
    flags.DEFINE_enum(
        "study",
        None,
        sorted({s for s, _ in presets.STUDIES}),
        "A study of what the paper leaves open, screened on dev at a reduced budget "
        "(rhnzoo.configs.rrl.STUDIES): 'rrn' the RRN recipe, 'skip' SC-LSTM's L; then its table.",
        module_name=__name__,
    )
    flags.DEFINE_boolean(
        "run_missing", True, "With --table / --study: train unfinished runs.", module_name=__name__
    )
    runner.define_flags()


def config() -> RRLConfig:
    """The flags as one checked :class:`RRLConfig`: ``--preset``'s settings on
    ``--dataset`` (:func:`rhnzoo.configs.rrl.get_config`), the flags given over them.

    Raises:
      ValueError: (one line) a bad setting; an ``--embeddings`` file that is not there;
        ``--table`` with ``--study`` (each is a run of its own); ``--buckets`` given past
        the distinct padded lengths ``--max_len`` has
        (:meth:`~rhnzoo.configs.rrl.TrainConfig.bucket_lengths`: the rest would do
        nothing).
    """
    if FLAGS.table and FLAGS.study:
        raise ValueError(
            f"--table (the --models' Table 3) and --study={FLAGS.study} (a study's "
            "own table) are separate runs: give one"
        )
    cfg = cli.config_from_flags(presets.get_config, _NAMES)
    spec = cfg.embeddings
    if spec not in (None, "word2vec", "random") and not pathlib.Path(spec).is_file():
        why = "is a directory" if pathlib.Path(spec).is_dir() else "no such file"
        raise ValueError(  # before the data set is read (IMDB: 20 s)
            f"--embeddings={spec}: {why}; give 'word2vec' (trained on the training split), "
            "'random' or a word2vec file"
        )
    lengths = cfg.bucket_lengths()
    if FLAGS["buckets"].present and cfg.buckets > len(lengths):
        raise ValueError(
            f"--buckets={cfg.buckets} at --max_len={cfg.max_len} gives only "
            f"{len(lengths)} distinct padded lengths "
            f"({', '.join(map(str, lengths))}): use --buckets <= {len(lengths)}"
        )
    return cfg


def check_fits(cfg: RRLConfig) -> None:
    """Refuses (:func:`rhnzoo.apps.cli.check_fits`: one line) a classifier of ``cfg``
    whose parameters and Adadelta state cannot fit a device, before the data are read:
    sized at a vocabulary of 2 words and 2 classes, a lower bound of any data set's."""
    pixels = cfg.dataset == "pmnist"
    model = cfg.classifier(2, cfg.embed_size if pixels else None, None if pixels else 2)
    tx = cfg.optimizer()

    def state():
        params = model.init(jax.random.PRNGKey(0))
        return {"params": params, "opt_state": tx.init(params)}

    hybrid = cfg.model in registry.PARALLEL_NAMES
    size = (
        f"--hybrid_hidden_size={cfg.hybrid_hidden_size}"
        if hybrid
        else f"--hidden_size={cfg.hidden_size}"
    )
    cli.check_fits(state, f"--model={cfg.model}, {size}, --embed_size={cfg.embedding_size()}")


def experiment() -> None:
    """The script's body: one model, the ``--table`` models or a ``--study``
    (:func:`rhnzoo.studies.rrl_table3.run_experiment`), from the flags; then one model's
    ``learning_curves.png`` (its first seed's; :func:`rhnzoo.apps.cli.write_learning_curves`)
    and the table (``--table``, ``--study``, or one model's ``--seeds`` > 1: mean ± sd)."""
    base = config()
    jobs, seeds = runner.from_flags()  # before JAX touches a device
    if base.distributed and jobs.n > 1:
        raise ValueError("--jobs > 1 and --distributed do not go together")
    configs = presets.runs(
        base, FLAGS.models if FLAGS.table else [base.model], FLAGS.study
    )  # every run checked: one line
    cli.initialize_distributed(base)
    cli.note_interpreted_kernels(base.scan_impl)
    if jobs.n == 1:  # this process trains (with --jobs > 1 each child checks its own)
        for c in configs.values():
            check_fits(c)
    primary = jax.process_index() == 0  # prints; the engine writes the files from it alone
    preset = base.preset or "custom"
    bi = "_bi" if base.bidirectional else ""  # beside the unidirectional runs, not in them
    root = pathlib.Path(base.workdir or f"runs/rrl_{base.dataset}_{preset}{bi}")
    title = f"{base.dataset}, preset {preset}" + (f", {seeds} seeds" if seeds > 1 else "")
    text = rrl_table3.run_experiment(
        configs,
        root,
        study=FLAGS.study,
        table=FLAGS.table,
        run_missing=FLAGS.run_missing,
        load=functools.cache(functools.partial(rrl.load_data, base)),
        title=title,
        log=print if primary else None,
        seeds=seeds,
        jobs=jobs,
    )
    if not (FLAGS.table or FLAGS.study):  # one model: its (first seed's) learning curves
        cli.write_learning_curves(root / base.model, "dev_acc", "train_acc")
    if text and primary:
        print(text)
