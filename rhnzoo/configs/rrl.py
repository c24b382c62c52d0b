"""The config and presets of sequence classification (Wang & Tian, EMNLP 2016;
``experiments/rrl.py``): :class:`RRLConfig` (every setting of a run, ``config.json``; its
optimisation and batching part :class:`TrainConfig`), the paper's and the 2-core CPU's
sizes per data set, and the studies of what the paper leaves open (screened on dev at a
reduced budget).

  get_config("cpu", "imdb")              # RRLConfig: the CPU sizes on IMDB
  get_config("cpu", "imdb", model="rrn") # ... with settings over the preset
  runs(base, models, "rrn")              # a study's runs: {setting: RRLConfig}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import optax

from rhnzoo import cells, data, dropout
from rhnzoo.cells import registry
from rhnzoo.config import (
    Config,
    DataSettings,
    DistributedSettings,
    RunSettings,
    check_scan_dtype,
    preset_settings,
    scan_impl_setting,
    setting,
)
from rhnzoo.models.classifier import SequenceClassifier

# Wang & Tian's models (Table 2), the rows of Table 3 (labels: rhnzoo.cells.label).
MODELS = ("lstm", "gru", "rrn", "sc_lstm_i", "sc_lstm_p", "hrl", "lstm_gru")
# Adadelta's decay (Zeiler 2012), as the paper's Keras code had it.
ADADELTA_RHO = 0.95


@dataclasses.dataclass(frozen=True)
class TrainConfig(Config):
    """Optimisation and batching settings of :func:`train_and_evaluate` (an
    :class:`RRLConfig` is one): Adadelta (rho :data:`ADADELTA_RHO`) after global-norm
    clipping, sequences cut to ``max_len`` steps in ``buckets`` padded lengths.

    Raises:
      ValueError: on construction, for a setting outside its range (one line naming it).
    """

    batch_size: int = setting(32, "Sequences per step.", low=1)
    max_len: int = setting(400, "Steps kept per sequence.", low=1)
    keep: str = setting("last", "Which steps a longer sequence keeps.", choices=("last", "first"))
    buckets: int = setting(4, "Padded lengths: max_len / 2^k, k < buckets.", low=1)
    lr: float = setting(1.0, "Adadelta learning rate (1: Zeiler's method as published).", gt=0)
    adadelta_eps: float = setting(1e-6, "Adadelta's epsilon.", gt=0)
    max_grad_norm: float = setting(5.0, "Global-norm gradient clipping.", gt=0)
    epochs: int = setting(10, "Epochs.", low=1)
    freeze_embeddings: bool = setting(
        False, "Keep the (pre-trained) embedding, params['embed'], fixed."
    )

    def bucket_lengths(self) -> tuple[int, ...]:
        """The padded lengths, ascending, the last ``max_len``."""
        lengths = {self.max_len}
        for k in range(1, self.buckets):
            lengths.add(max(8, -(-(self.max_len >> k) // 8) * 8))
        return tuple(sorted(x for x in lengths if x <= self.max_len))

    def optimizer(self) -> optax.GradientTransformation:
        """Clipping to ``max_grad_norm``, then Adadelta (``lr``, ``adadelta_eps``); with
        ``freeze_embeddings`` the embedding gets zero updates and no part of the norm."""
        tx = optax.chain(
            optax.clip_by_global_norm(self.max_grad_norm),
            optax.adadelta(learning_rate=self.lr, rho=ADADELTA_RHO, eps=self.adadelta_eps),
        )
        if not self.freeze_embeddings:
            return tx
        # The frozen embedding neither moves nor counts in the clipped gradient norm.
        return optax.multi_transform(
            {"trained": tx, "frozen": optax.set_to_zero()}, _embedding_frozen
        )


def _embedding_frozen(params: Mapping[str, Any]) -> dict[str, str]:
    """``optax.multi_transform``'s labels: ``'frozen'`` for ``params['embed']``."""
    return {k: "frozen" if k == "embed" else "trained" for k in params}


# The data sets of experiments/rrl.py, the default first, then the registry's order.
DATASETS = ("imdb", *(name for name in data.names("sequences") if name != "imdb"))


@dataclasses.dataclass(frozen=True)
class RRLConfig(TrainConfig, RunSettings, DataSettings, DistributedSettings):
    """One sequence-classification run, one field per setting (the flags of
    ``experiments/rrl.py``; ``to_dict()`` is its ``config.json``).

    Raises:
      ValueError: (one line, on construction) an unknown cell or data set, a bad cell
        setting, a training setting out of range, a drop probability outside [0, 1),
        ``subset`` < 1, ``coverage`` outside (0, 1], a bad run setting.
    """

    NOT_FLAGS = frozenset({"preset"})

    # The model: the cell and its width (Table 2), the embedding (m) or pixel.
    model: str = setting(
        "lstm",
        "Recurrent layer: a cell of rhnzoo.cells (Wang & Tian's: "
        f"{', '.join(MODELS)}; also rhn, hsg_rhn, dtrnn, ...).",
    )
    embed_size: int = setting(256, "Embedding width m (P-MNIST: 1, the pixel).", low=1)
    hidden_size: int = setting(512, "Hidden units n (LSTM, GRU, RRN, SC-LSTM).", low=1)
    hybrid_hidden_size: int = setting(384, "Hidden units per cell of HRL / LSTM+GRU.", low=1)
    hybrid_embed_size: int | None = setting(
        None, "Embedding width of HRL / LSTM+GRU (default: --embed_size).", low=1
    )
    # The cells' own settings (each goes to the cells that have it).
    rrn_depth: int = setting(2, "K, layers of the RRN transition F (eq. 4).", low=1)
    rrn_activation: str = setting(
        "sigmoid",
        "Inner activation of the RRN transition (the paper's σ is the logistic function).",
        choices=("sigmoid", "tanh"),
    )
    rrn_recurrent_init: str = setting("uniform", "RRN U_k init.", choices=("uniform", "orthogonal"))
    rrn_f_bias: float = setting(0.0, "Initial bias of the RRN's last F layer (paper: 0).")
    skip: int = setting(20, "SC-LSTM skip length L (eq. 5).", low=1)
    bidirectional: bool = setting(False, "A forward and a backward layer (cells.Bidirectional).")
    gru_reset_after: bool = setting(
        False,
        "GRU: reset gate after the recurrent matmul, "
        "as torch.nn.GRU / cuDNN (default: before, Cho et al. "
        "2014, the paper's).",
    )
    # Initialisation, dropout and the time scan.
    forget_bias: float = setting(1.0, "Initial LSTM forget-gate bias.")
    init_scale: float = setting(0.1, "Uniform initialisation half-width.")
    drop: float = setting(0.5, "Dropout probability on the final representation.")
    input_drop: float = setting(0.0, "Dropout probability on the embedded inputs.")
    scan_impl: str = scan_impl_setting()
    dtype: str = setting(
        "float32",
        "Matmul inputs of the recurrent layer, float32 accumulation: float32 "
        "(computed at --matmul_precision: TF32 / bfloat16 passes by default on GPUs / TPUs) "
        "or bfloat16 (float32 state and parameters).",
        choices=("float32", "bfloat16"),
    )
    # The data.
    dataset: str = setting("imdb", "Data set.", choices=DATASETS)
    subset: int | None = setting(None, "Train on this many training sequences (screening).", low=1)
    eval_subset: int | None = setting(
        None,
        "Evaluate on this many dev and this many test "
        "sequences, a fixed sample of each (smoke runs; "
        "default: all).",
        low=1,
    )
    embeddings: str | None = setting(
        "word2vec",
        "Text: 'word2vec' (trained on the training split, cached), 'random' "
        "(learned from scratch) or a word2vec file.",
    )
    coverage: float = setting(
        0.95,
        "Vocabulary: most frequent words covering this fraction "
        "(in (0, 1]) of the training tokens; the rest is <unk>.",
    )
    dev_seed: int = setting(0, "Seed of the 15 % dev split.", low=0)
    permute: bool = setting(
        True, "P-MNIST: the fixed pixel permutation (--nopermute: sequential MNIST)."
    )
    data_source: str = setting(
        "files",
        "Original files (download, checksum, cache) or "
        "TensorFlow Datasets (pip install 'rhnzoo[tfds]').",
        choices=data.SOURCES,
    )
    # The run: its directory and preset (the engine's settings are RunSettings').
    workdir: str | None = setting(
        None,
        "Root directory: a model trains in <root>/<model>, "
        "a study in <root>/study_<study>; rerunning resumes "
        "(default: runs/rrl_<dataset>_<preset>).",
        resumable=True,
    )
    preset: str | None = setting(None, "The preset's name, recorded.", resumable=True)

    def check(self) -> None:
        super().check()  # the training and run settings
        check_scan_dtype(self.scan_impl, self.dtype)
        SequenceClassifier(self.cell(), 2, 1, **self._scan())
        dropout.check_rate("--drop", self.drop)
        dropout.check_rate("--input_drop", self.input_drop)
        if not 0 < self.coverage <= 1:
            raise ValueError(f"--coverage must be a fraction in (0, 1], got {self.coverage}")

    def cell(self):
        """The recurrent layer: :func:`rhnzoo.cells.make` of ``model``, ``hybrid_hidden_size``
        units per cell for the two-cell hybrids (:data:`~rhnzoo.cells.registry.PARALLEL_NAMES`),
        else ``hidden_size``. Raises ValueError (one line)."""
        settings = {
            "depth": self.rrn_depth,
            "activation": self.rrn_activation,
            "skip": self.skip,
            "recurrent_init": self.rrn_recurrent_init,
            "f_bias": self.rrn_f_bias,
            "forget_bias": self.forget_bias,
            "init_scale": self.init_scale,
            "reset_after": self.gru_reset_after,
        }
        n = self.hybrid_hidden_size if self.model in registry.PARALLEL_NAMES else self.hidden_size
        return cells.make(self.model, n, **cells.applicable(self.model, settings))

    def embedding_size(self) -> int:
        """m, the embedding width of ``model``: ``hybrid_embed_size`` (when set) for the
        two-cell hybrids, else ``embed_size`` (Wang & Tian Table 2, 20NG: 500, hybrids 256)."""
        hybrid = self.model in registry.PARALLEL_NAMES and self.hybrid_embed_size is not None
        return self.hybrid_embed_size if hybrid else self.embed_size

    def _scan(self) -> dict[str, Any]:
        return {"scan_impl": self.scan_impl, "dtype": self.dtype}

    def classifier(
        self, num_classes: int, input_size: int | None = None, vocab_size: int | None = None
    ) -> SequenceClassifier:
        """The model: embedding (``vocab_size`` tokens of :meth:`embedding_size`) or
        ``input_size`` features per step -> :meth:`cell` -> dropout -> softmax over
        ``num_classes``. Raises ValueError for a bad size."""
        return SequenceClassifier(
            self.cell(),
            num_classes,
            input_size or self.embedding_size(),
            vocab_size,
            drop=self.drop,
            input_drop=self.input_drop,
            init_scale=self.init_scale,
            bidirectional=self.bidirectional,
            **self._scan(),
        )


# Wang & Tian Table 2: embedding x hidden (hybrids: hidden per cell; 20NG's hybrids also
# a narrower embedding, 256 x 512).
PAPER_SIZES = {
    "imdb": dict(embed_size=256, hidden_size=512, hybrid_hidden_size=384),
    "agnews": dict(embed_size=256, hidden_size=512, hybrid_hidden_size=384),
    "20ng": dict(embed_size=500, hidden_size=768, hybrid_embed_size=256, hybrid_hidden_size=512),
    "pmnist": dict(embed_size=1, hidden_size=100, hybrid_hidden_size=80, max_len=784, buckets=1),
}
# The long documents' CPU sizes (IMDB reviews, 20NG posts): the last 400 steps of each.
_CPU_DOCUMENTS = dict(
    embed_size=64,
    hidden_size=128,
    hybrid_hidden_size=96,
    max_len=400,
    epochs=10,
    patience=3,
    batch_size=32,
)
# 2-core CPU, about 7-30 minutes per model (measured times in README / docs/rrl.md):
# smaller widths than Table 2, the last 400 steps of a review, fewer epochs.
CPU_SIZES = {
    "imdb": _CPU_DOCUMENTS,
    "agnews": dict(
        embed_size=64, hidden_size=128, hybrid_hidden_size=96, max_len=64, epochs=3, batch_size=64
    ),
    "20ng": _CPU_DOCUMENTS,
    "pmnist": dict(
        embed_size=1,
        hidden_size=64,
        hybrid_hidden_size=48,
        max_len=784,
        buckets=1,
        epochs=8,
        batch_size=100,
    ),
}
# preset -> data set -> settings (overrides, e.g. flags given explicitly, win over them).
PRESETS = {"paper": PAPER_SIZES, "cpu": CPU_SIZES}

# Studies (issue 15): what the paper leaves open, screened at a reduced budget on dev.
# (study, dataset) -> the model, the budget (config overrides), and the settings
# (setting name -> config overrides; a ``model`` key runs another model, e.g. the LSTM
# as a reference at the same budget). `rrn`: the RRN recipe (eqs. 3-4 and sec. 4 leave
# initialisation, the bias of F, input scale, Adadelta's eps, clipping and dropout
# placement open); `skip`: SC-LSTM's skip length L, which the paper tuned on dev (sec. 4).
_W2V = {"embeddings": "word2vec"}
_RRN_SETTINGS = {
    "paper": {},
    "fbias-3": {"rrn_f_bias": -3.0},
    "fbias-1": {"rrn_f_bias": -1.0},
    "orth": {"rrn_recurrent_init": "orthogonal"},
    "orth_fbias-3": {"rrn_recurrent_init": "orthogonal", "rrn_f_bias": -3.0},
    "init0.3": {"init_scale": 0.3},
    "eps1e-4": {"adadelta_eps": 1e-4},
    "clip1": {"max_grad_norm": 1.0},
    "clip50": {"max_grad_norm": 50.0},
    "tanh": {"rrn_activation": "tanh"},
    "lstm_reference": {"model": "lstm"},
}
SCREEN = {
    "imdb": dict(max_len=100, epochs=3, patience=None, buckets=2, divergence_factor=5.0),
    "pmnist": dict(subset=12000, epochs=3, divergence_factor=5.0),
}
STUDIES = {
    ("rrn", "imdb"): dict(
        model="rrn",
        budget=SCREEN["imdb"],
        settings={
            "paper_random_emb": {"embeddings": "random"},
            **{
                ("paper_w2v" if k == "paper" else k if "model" in v else f"w2v_{k}"): {**_W2V, **v}
                for k, v in _RRN_SETTINGS.items()
            },
            "w2v_indrop0.25": {**_W2V, "input_drop": 0.25},
            "w2v_frozen": {**_W2V, "freeze_embeddings": True},
        },
    ),
    ("rrn", "pmnist"): dict(
        model="rrn",
        budget=SCREEN["pmnist"],
        settings={
            **_RRN_SETTINGS,
            "tanh_init0.03": {"rrn_activation": "tanh", "init_scale": 0.03},
            "tanh_clip1": {"rrn_activation": "tanh", "max_grad_norm": 1.0},
        },
    ),
    ("skip", "imdb"): dict(
        model="sc_lstm_i",
        budget=dict(subset=8000, epochs=3, patience=None),
        settings={f"L{L}": {"skip": L} for L in (10, 20, 50)},
    ),
    ("skip", "pmnist"): dict(
        model="sc_lstm_i",
        budget=dict(subset=12000, epochs=3),
        settings={f"L{L}": {"skip": L} for L in (10, 20, 50)},
    ),
}


def preset_overrides(preset: str | None, dataset: str) -> dict[str, Any]:
    """The settings ``preset`` (None: none) gives on ``dataset``, beside the defaults:
    P-MNIST's input is one pixel per step (``embed_size=1``) under every preset.

    Raises:
      ValueError: an unknown preset (one line).
    """
    pixel = {"embed_size": 1} if dataset == "pmnist" else {}
    return {**pixel, **preset_settings(PRESETS, preset).get(dataset, {})}


def get_config(preset: str | None = None, dataset: str = "imdb", **overrides: Any) -> RRLConfig:
    """The config of ``preset`` (``'paper'``: Table 2's sizes; ``'cpu'``: the 2-core CPU
    budget; None: the defaults) on ``dataset``, with ``overrides`` (e.g. the flags given)
    over it; the preset's name is recorded in it.

    Example: ``get_config("cpu", "pmnist", model="rrn", epochs=2)``.

    Raises:
      ValueError: an unknown preset or data set, an unknown or bad setting (one line).
    """
    return RRLConfig.from_dict(
        {**preset_overrides(preset, dataset), **overrides, "dataset": dataset, "preset": preset}
    )


def study(name: str, dataset: str) -> dict[str, Any]:
    """The study ``name`` on ``dataset`` (:data:`STUDIES`: its model, budget and
    settings). Raises ValueError (one line) where there is none."""
    spec = STUDIES.get((name, dataset))
    if spec is None:
        raise ValueError(
            f"no {name} study on {dataset}; studies: {', '.join('/'.join(k) for k in STUDIES)}"
        )
    return spec


def runs(
    base: RRLConfig, models: Sequence[str], study_name: str | None = None
) -> dict[str, RRLConfig]:
    """Every run of an experiment, ``{name: config}``, from one ``base`` config (the
    script's flags): one run per model of ``models`` (named by the model; ``base.model``
    replaced), or with ``study_name`` one per setting of that study on ``base.dataset``
    (its model, its budget and the setting over ``base``).

    Raises:
      ValueError: no such study, or a bad setting of any run (one line, before anything
        is trained).
    """
    if study_name is None:
        return {m: base.replace(model=m) for m in dict.fromkeys(models)}
    spec = study(study_name, base.dataset)
    return {
        name: base.replace(**{**spec["budget"], "model": spec["model"], **setting})
        for name, setting in spec["settings"].items()
    }
