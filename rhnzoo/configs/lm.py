"""The language models' presets: every named setting of ``experiments/ptb.py``,
``experiments/char.py`` and the depth sweep, as :class:`rhnzoo.tasks.lm.LMConfig`.

* word level (PTB): the reference code's ``ptb_sota`` (Zilly et al. 2017,
  jzilly/RecurrentHighwayNetworks ``rhn_train.py``) is :class:`LMConfig`'s defaults;
  ``--preset=small`` fits a 2-core CPU;
* character level (enwik8, text8, PTB-char): the reference ``enwik8_sota`` (=
  ``text8_sota``, test BPC 1.27) and a ``small`` preset for PTB-char on a 2-core CPU.

:func:`get_config` gives a data set's config with a preset and settings applied (with
``hsg=True``, the HSG paper's RHN gate bias); :func:`defaults` and :func:`presets` are
what the scripts' flags are defined from.
"""

from __future__ import annotations

from typing import Any

from rhnzoo import data
from rhnzoo.config import preset_settings
from rhnzoo.tasks.lm import HSG_RHN_INIT_BIAS, LMConfig

# The reference code's ``enwik8_sota`` (= ``text8_sota``) configuration.
ENWIK8_SOTA = dict(
    depth=10,
    hidden_size=1500,
    init_scale=0.04,
    init_bias=-4.0,
    lr=0.2,
    lr_decay=1.03,
    max_epoch=5,
    max_max_epoch=500,
    weight_decay=1e-7,
    max_grad_norm=10.0,
    num_steps=50,
    batch_size=128,
    drop_x=0.10,
    drop_i=0.40,
    drop_h=0.10,
    drop_o=0.40,
    tied=False,
)

PTB_PRESETS = {
    # ``experiments/ptb.py --preset=small``: a 2-core CPU in about 30 minutes; see
    # docs/rhn.md for its measured result (lr 1.0 with clipping at 10 diverged in epoch 2).
    "small": dict(
        hidden_size=256,
        depth=3,
        lr=0.5,
        max_grad_norm=5.0,
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

CHAR_PRESETS = {
    # --dataset=ptb_char on a 2-core CPU in 15-25 minutes (4 epochs of ~1570 steps); tuned
    # briefly: lr 1.0 diverges and 0.2-0.3 learns slowly; init_bias -1 and windows of 50
    # learned faster than -2 and 100; no dropout (the model underfits in 4 epochs).
    "small": dict(
        hidden_size=256,
        depth=3,
        batch_size=64,
        num_steps=50,
        init_bias=-1.0,
        lr=0.5,
        max_epoch=2,
        lr_decay=2.0,
        max_max_epoch=4,
        drop_x=0.0,
        drop_i=0.0,
        drop_h=0.0,
        drop_o=0.0,
        eval_num_steps=1000,
    ),
}
# The data set each character-level preset is sized for: ``char.py --preset=small`` alone
# is PTB-char (the enwik8 defaults of char.py would apply its sizes to a 20x larger set and
# download it), and the preset with another --dataset is refused (rhnzoo.apps.lm.config).
CHAR_PRESET_DATASETS = {"small": "ptb_char"}


def char_level(dataset: str) -> bool:
    """Whether ``dataset`` (a registered LM data set) is character level (bits per character)."""
    return data.registry.get(dataset, task="lm").metric == "bpc"


def char_sets() -> list[str]:
    """The character-level data sets (``experiments/char.py``'s ``--dataset``)."""
    return [name for name in data.names("lm") if char_level(name)]


def defaults(dataset: str = "ptb") -> LMConfig:
    """The reference configuration of ``dataset``: ``ptb_sota`` for PTB, ``enwik8_sota``
    for a character-level set. Raises ValueError for an unknown data set."""
    return LMConfig(dataset=dataset, **(ENWIK8_SOTA if char_level(dataset) else {}))


def presets(dataset: str = "ptb") -> dict[str, dict[str, Any]]:
    """The named presets of ``dataset``'s script: ``{name: settings overriding
    defaults(dataset)}``."""
    return CHAR_PRESETS if char_level(dataset) else PTB_PRESETS


def get_config(preset: str | None = None, dataset: str = "ptb", **overrides: Any) -> LMConfig:
    """``defaults(dataset)`` with ``preset`` (None: none; named in the config) and then
    ``overrides`` applied. An HSG model (``hsg=True``) takes Shoham & Permuter's RHN
    transform-gate bias, ``init_bias=-2.5``, unless the preset or ``overrides`` set it.

    Example: ``get_config(depth=40, hsg=True)`` is the HSG paper's depth-40 model.

    Raises:
      ValueError: an unknown data set or preset, an unknown or bad setting (one line).
    """
    settings = {**preset_settings(presets(dataset), preset), **overrides}
    if settings.get("hsg") and "init_bias" not in settings:
        settings["init_bias"] = HSG_RHN_INIT_BIAS
    return defaults(dataset).replace(preset=preset, **settings)
