"""Presets of sequence classification (Wang & Tian, EMNLP 2016; ``experiments/rrl.py``):
the paper's and the 2-core CPU's sizes per data set, and the studies of what the paper
leaves open (screened on dev at a reduced budget).

  get_config("cpu", "imdb")              # RRLConfig: the CPU sizes on IMDB
  get_config("cpu", "imdb", model="rrn") # ... with settings over the preset
  runs(base, models, "rrn")              # a study's runs: {setting: RRLConfig}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rhnzoo.config import preset_settings
from rhnzoo.tasks.rrl import RRLConfig

# Wang & Tian Table 2: embedding x hidden (hybrids: hidden per cell; 20NG's hybrids also
# a narrower embedding, 256 x 512).
PAPER_SIZES = {
    "imdb": dict(embed_size=256, hidden_size=512, hybrid_hidden_size=384),
    "agnews": dict(embed_size=256, hidden_size=512, hybrid_hidden_size=384),
    "20ng": dict(embed_size=500, hidden_size=768, hybrid_embed_size=256, hybrid_hidden_size=512),
    "pmnist": dict(embed_size=1, hidden_size=100, hybrid_hidden_size=80, max_len=784, buckets=1),
}
# 2-core CPU, about 7-30 minutes per model (measured times in README / docs/rrl.md):
# smaller widths than Table 2, the last 400 steps of a review, fewer epochs.
CPU_SIZES = {
    "imdb": dict(
        embed_size=64,
        hidden_size=128,
        hybrid_hidden_size=96,
        max_len=400,
        epochs=10,
        patience=3,
        batch_size=32,
    ),
    "agnews": dict(
        embed_size=64, hidden_size=128, hybrid_hidden_size=96, max_len=64, epochs=3, batch_size=64
    ),
    "20ng": dict(
        embed_size=64,
        hidden_size=128,
        hybrid_hidden_size=96,
        max_len=400,
        epochs=10,
        patience=3,
        batch_size=32,
    ),
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
