"""The language models' config and presets (``experiments/ptb.py``, ``char.py``, the depth
sweep): :class:`LMConfig`, whose defaults are the reference code's ``ptb_sota`` (Zilly et
al. 2017, jzilly/RecurrentHighwayNetworks ``rhn_train.py``), on a character-level set
:data:`ENWIK8_SOTA` (= ``text8_sota``, test BPC 1.27); ``small`` presets fit a 2-core CPU.
:func:`get_config` applies a preset and settings; :func:`defaults` and :func:`presets`
define the scripts' flags.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import optax

from rhnzoo import cells, data, dropout
from rhnzoo.config import (
    DataSettings,
    DistributedSettings,
    RunSettings,
    check_scan_dtype,
    preset_settings,
    scan_impl_setting,
    setting,
)
from rhnzoo.models import lm as lm_models
from rhnzoo.models.lm import LanguageModel

# The LM settings that go to the cell (:func:`rhnzoo.cells.make`) where it has them.
CELL_KEYS = ("depth", "coupled", "init_bias")
# Shoham & Permuter: "An initial bias of -2.5 was used for both the RHN and the HSG gates."
HSG_RHN_INIT_BIAS = -2.5
# The reference code's RHN T bias: ``ptb_sota`` (word level) and ``enwik8_sota``.
WORD_INIT_BIAS, CHAR_INIT_BIAS = -2.0, -4.0


def default_init_bias(dataset: str, hsg: bool) -> float:
    """The RHN transform-gate bias of a run that does not set it: :data:`HSG_RHN_INIT_BIAS`
    with ``hsg``, else :data:`CHAR_INIT_BIAS` on a character-level set,
    :data:`WORD_INIT_BIAS` on a word-level one. Raises ValueError for an unknown data set."""
    if hsg:
        return HSG_RHN_INIT_BIAS
    return CHAR_INIT_BIAS if char_level(dataset) else WORD_INIT_BIAS


@dataclasses.dataclass(frozen=True)
class LMConfig(RunSettings, DataSettings, DistributedSettings):
    """Every setting of a language-model run, one field each (the scripts' flags;
    ``to_dict()`` is the run's ``config.json``). Defaults: the reference code's ``ptb_sota``.

    ``init_bias`` left out (None) is :func:`default_init_bias` of ``dataset`` and
    ``hsg``, resolved on construction and recorded; :meth:`replace` resolves it again
    where it was at that default (``LMConfig().replace(hsg=True).init_bias`` is -2.5, as
    ``LMConfig(hsg=True)``'s).

    Raises:
      ValueError: on construction, for a setting out of range (one line naming it): an
        unknown data set, a bad rate, learning rate, size, run setting or model option; a
        cell setting (``depth``, ``coupled``, ``init_bias``) away from its default for a
        cell without it; ``hsg_init_bias`` away from its default without ``hsg``.
    """

    # The data set is the script's (ptb.py's own; char.py defines --dataset itself).
    NOT_FLAGS = frozenset({"preset", "dataset"})

    dataset: str = setting(
        "ptb", "Language-model data set (its metric: perplexity or bits per character)."
    )
    preset: str | None = setting(None, "The preset's name, recorded.", resumable=True)
    cell: str = setting(
        "rhn",
        "Recurrent cell (rhnzoo.cells registry; --scan_impl picks its time scan).",
        choices=cells.registry.NAMES,
    )
    depth: int = setting(
        10,
        "Recurrence depth L (micro-layers per time step; cells with a "
        "depth: rhn, dtrnn, dtsrnn, rrn, hrl).",
        low=1,
    )
    hidden_size: int = setting(830, "Units per micro-layer.", low=1)
    hsg: bool = setting(
        False,
        "Add the Highway State Gate (Shoham & Permuter) around --cell; "
        f"the RHN T bias then defaults to {HSG_RHN_INIT_BIAS} as in the paper.",
    )
    hsg_init_bias: float = setting(-2.5, "Initial HSG gate bias b_G.")
    coupled: bool = setting(True, "Coupled carry gate C = 1 - T (RHN).")
    tied: bool = setting(True, "Tie the embedding and softmax weights.")
    init_scale: float = setting(0.04, "Uniform initialisation half-width.", gt=0)
    init_bias: float | None = setting(
        None,
        f"Initial RHN transform-gate bias (default: {WORD_INIT_BIAS}, {CHAR_INIT_BIAS} on a "
        f"character-level set, {HSG_RHN_INIT_BIAS} with --hsg as in the HSG paper).",
    )
    lr: float = setting(0.2, "Initial SGD learning rate lr0 (loss summed over time / batch).", gt=0)
    lr_decay: float = setting(1.02, "Learning-rate divisor per epoch after max_epoch.", low=1)
    max_epoch: int = setting(20, "Epochs at constant learning rate.", low=0)
    max_max_epoch: int = setting(500, "Total epochs of the schedule (alias --epochs).", low=1)
    weight_decay: float = setting(1e-7, "L2 coefficient (on 0.5 ||theta||^2).", low=0)
    max_grad_norm: float = setting(10.0, "Global-norm gradient clipping.", gt=0)
    num_steps: int = setting(35, "Truncated-BPTT window length T.", low=1)
    batch_size: int = setting(20, "Batch size B (rows of the token stream).", low=1)
    drop_x: float = setting(0.25, "Word-dropout probability on the embedding.")
    drop_i: float = setting(0.75, "Dropout probability on the cell input.")
    drop_h: float = setting(0.25, "Dropout probability on the recurrent state.")
    drop_o: float = setting(0.75, "Dropout probability on the cell output.")
    unroll: int = setting(1, "Time steps per lax.scan iteration.", low=1, resumable=True)
    scan_impl: str = scan_impl_setting()
    remat: bool = setting(
        False, "Recompute time steps in the backward pass (less memory).", resumable=True
    )
    dtype: str = setting(
        "float32",
        "Matmul input dtype, float32 accumulation: float32 (computed at "
        "--matmul_precision, whose default on GPUs and TPUs rounds the inputs to TF32 / "
        "bfloat16) or bfloat16 (needs the fused or pallas scan).",
        choices=("float32", "bfloat16"),
    )
    eval_batch_size: int | None = setting(
        None,
        "Final evaluation batch size (default: 1, the reference protocol, for a full "
        "run; the training batch for a run cut short).",
        low=1,
        resumable=True,
    )
    eval_num_steps: int = setting(
        100,
        "Window length of evaluation scans (any value gives "
        "the same numbers up to float rounding).",
        low=1,
        resumable=True,
    )
    workdir: str | None = setting(
        None,
        "Run directory; rerunning with it resumes (default: runs/<dataset>_<settings>).",
        resumable=True,
    )

    def __post_init__(self):
        if self.init_bias is None and self.dataset in data.names("lm"):
            object.__setattr__(self, "init_bias", default_init_bias(self.dataset, self.hsg))
        super().__post_init__()

    def check(self) -> None:
        data.registry.get(self.dataset, task="lm")
        super().check()
        check_scan_dtype(self.scan_impl, self.dtype)
        for site in "xiho":
            dropout.check_rate(f"--drop_{site}", getattr(self, f"drop_{site}"))
        stray = [
            f"--{k}"
            for k in CELL_KEYS
            if k not in cells.options(self.cell) and getattr(self, k) != self._cell_default(k)
        ]
        if stray:
            raise ValueError(
                f"{', '.join(stray)} does not apply to --cell={self.cell} (its "
                f"options: {', '.join(cells.options(self.cell))})"
            )
        if not self.hsg and self.hsg_init_bias != _FIELDS["hsg_init_bias"].default:
            raise ValueError(
                f"--hsg_init_bias={self.hsg_init_bias} sets the Highway State Gate's "
                "bias: it needs --hsg"
            )
        self.model(2)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, strict: bool = True) -> LMConfig:
        """:meth:`Config.from_dict`, but a cell setting its cell lacks is read as its default
        (older runs recorded every cell's ``depth``, e.g. an LSTM's 3): such a workdir
        resumes, while a stray value given to the constructor is still refused."""
        if isinstance(values, Mapping):  # else refused there, one line
            values = _for_cell(values, values.get("cell", _FIELDS["cell"].default))
        return super().from_dict(values, strict=strict)

    def _cell_default(self, key: str) -> Any:
        """The value of cell setting ``key`` when not given."""
        if key == "init_bias":
            return default_init_bias(self.dataset, self.hsg)
        return _FIELDS[key].default

    def replace(self, **changes: Any) -> LMConfig:
        """A copy with ``changes`` (checked); an ``init_bias`` at its default follows the
        fields it is derived from (:func:`default_init_bias`). Raises ValueError (one
        line) for a key that is no field or a value out of range."""
        if "init_bias" not in changes and self.init_bias == self._cell_default("init_bias"):
            changes["init_bias"] = None
        return super().replace(**changes)

    @property
    def rates(self) -> dropout.Rates:
        return dropout.Rates(self.drop_x, self.drop_i, self.drop_h, self.drop_o)

    @property
    def metric(self) -> str:
        """``'ppl'`` (perplexity) or ``'bpc'`` (bits per character): the data set's."""
        return data.registry.get(self.dataset, task="lm").metric

    @property
    def run_dir(self) -> str:
        """``workdir``, else ``runs/<dataset>_<preset>[_<cell>][_d<depth>]_n<size>[_hsg]``."""
        if self.workdir:
            return self.workdir
        depth = "depth" in cells.options(self.cell)
        return (
            f"runs/{self.dataset}_{self.preset or 'default'}"
            f"{'' if self.cell == 'rhn' else '_' + self.cell}"
            f"{'_d' + str(self.depth) if depth else ''}_n{self.hidden_size}"
            f"{'_hsg' if self.hsg else ''}"
        )

    @property
    def epochs(self) -> int:
        """The schedule's epochs (the engine's run length): ``max_max_epoch``."""
        return self.max_max_epoch

    def model(self, vocab_size: int) -> LanguageModel:
        """The language model of these settings over ``vocab_size`` symbols."""
        return lm_models.language_model(
            self.cell,
            vocab_size,
            self.hidden_size,
            hsg=self.hsg,
            tied=self.tied,
            init_scale=self.init_scale,
            hsg_init_bias=self.hsg_init_bias,
            unroll=self.unroll,
            scan_impl=self.scan_impl,
            remat=self.remat,
            dtype=self.dtype,
            **cells.applicable(self.cell, {k: getattr(self, k) for k in CELL_KEYS}),
        )

    def schedule(self, steps_per_epoch: int) -> optax.Schedule:
        """The reference learning-rate schedule as a function of the step count."""
        return functools.partial(
            learning_rate,
            lr=self.lr,
            lr_decay=self.lr_decay,
            max_epoch=self.max_epoch,
            steps_per_epoch=steps_per_epoch,
        )


def learning_rate(count, *, lr: float, lr_decay: float, max_epoch: int, steps_per_epoch: int):
    """lr / lr_decay ** max(epoch - max_epoch + 1, 0) at step ``count`` (epochs from 0)."""
    epoch = count // steps_per_epoch
    return lr / lr_decay ** jnp.maximum(epoch - max_epoch + 1, 0)


_FIELDS = {f.name: f for f in dataclasses.fields(LMConfig)}


def _for_cell(values: Mapping[str, Any], cell: str) -> Mapping[str, Any]:
    """``values`` less the cell settings (:data:`CELL_KEYS`) a registered ``cell`` lacks."""
    if cell not in cells.registry.NAMES:
        return values
    return {k: v for k, v in values.items() if k not in CELL_KEYS or k in cells.options(cell)}


# The reference code's ``enwik8_sota`` (= ``text8_sota``) configuration.
ENWIK8_SOTA = dict(
    depth=10,
    hidden_size=1500,
    init_scale=0.04,
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
# is PTB-char, not enwik8 (20x larger, downloaded); another --dataset is refused
# (rhnzoo.apps.lm.config).
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
    ``overrides`` applied. A preset's cell settings (``depth``...) go to the cells that
    have them; ``init_bias`` not set follows :func:`default_init_bias` (-2.5 with ``hsg``).

    Example: ``get_config(depth=40, hsg=True)`` is the HSG paper's depth-40 model.

    Raises:
      ValueError: an unknown data set or preset, an unknown or bad setting (one line).
    """
    named = _for_cell(preset_settings(presets(dataset), preset), overrides.get("cell", "rhn"))
    return defaults(dataset).replace(preset=preset, **{**named, **overrides})
