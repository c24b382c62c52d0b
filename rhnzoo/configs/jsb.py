"""The configs and presets of the JSB Chorales optimisation study (``experiments/jsb.py``),
all on :class:`TrainSettings`: :class:`PolyphonicConfig` (one model's training) and its
:class:`TrialConfig` (one trial, its workdir's ``config.json``); :class:`JSBConfig` (the
study: its flags, its root's ``config.json``). What every trial shares
(:meth:`JSBConfig.shared`) is declared once for both.

The study is Zilly et al. (2017), sec. 5.1 and Fig. 4: next-step prediction on JSB
Chorales with RHN, DT-RNN and DT(S)-RNN at recurrence depths 1, 2, 4 and 6, the
architectures of a depth holding the same number of parameters, each trained with
random hyperparameter settings (the defaults of :class:`JSBConfig`). The paper gives
neither the sizes nor the search budget: the width 64, 20 trials of 40 epochs and batch
16, and the search space (:data:`rhnzoo.studies.jsb.SEARCH_SPACE`) are ours.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rhnzoo import cells
from rhnzoo.config import (
    DataSettings,
    RunSettings,
    check_scan_dtype,
    preset_settings,
    scan_impl_setting,
    setting,
)
from rhnzoo.models.piano_roll import PianoRollModel

# The init settings of the compiled model of every trial: one compiled step per (arch,
# depth); a trial's own init_scale / init_bias only shape its initial parameters.
STATIC_INIT = {"init_scale": 0.04, "init_bias": -2.0}


@dataclasses.dataclass(frozen=True)
class TrainSettings(RunSettings):
    """How long, and on what batches, a piano-roll model trains: the engine's
    :class:`~rhnzoo.config.RunSettings`, ``epochs`` and ``batch_size`` (defaults: the full
    JSB study's).

    Raises:
      ValueError: (one line naming the flag) a value out of range.
    """

    epochs: int = setting(
        40, "Epochs of SGD at a constant learning rate (the best validation epoch is kept).", low=1
    )
    batch_size: int = setting(
        16,
        "Sequences per SGD step (whole-sequence BPTT, padded to the longest training sequence).",
        low=1,
    )


@dataclasses.dataclass(frozen=True)
class PolyphonicConfig(TrainSettings):
    """How one piano-roll model trains (:func:`train_and_evaluate`): the
    :class:`TrainSettings` and the clipped-SGD hyperparameters (:func:`sgd`).

    Raises:
      ValueError: (one line naming the flag) lr <= 0, momentum outside [0, 1),
        max_grad_norm <= 0, or any :class:`TrainSettings` value out of range.
    """

    lr: float = setting(0.1, "SGD learning rate.", gt=0)
    momentum: float = setting(0.0, "Heavy-ball momentum in [0, 1) (0: plain SGD).", low=0)
    max_grad_norm: float = setting(10.0, "Global-norm gradient clipping threshold.", gt=0)

    def check(self) -> None:
        super().check()
        if not self.momentum < 1:
            raise ValueError(f"--momentum must be < 1, got {self.momentum}")


# ---------------------------------------------------------- the JSB study (Zilly et al.)

# A study's finished trials are never trained again (they keep their results only), so in
# a study and its trials the run settings that shape a trial's result are structural,
# though a checkpointed run may change them on resume.
STUDY_STRUCTURAL = frozenset({"max_steps", "max_epochs", "patience", "divergence_factor"})


def width_setting() -> Any:
    """The ``width`` field of a study and of its trials (every trial takes its study's)."""
    return setting(
        64,
        "RHN width defining the target parameter count at each depth "
        "(the other cells get the width with the nearest count).",
        low=1,
    )


@dataclasses.dataclass(frozen=True)
class JSBConfig(TrainSettings, DataSettings):
    """The JSB Chorales optimisation study (``experiments/jsb.py``, whose flags are these
    fields; defaults: the full study). Every trial takes the study's :meth:`shared`
    settings (``seed`` also draws the hyperparameters); :data:`STUDY_STRUCTURAL` are
    structural here. :meth:`to_dict` is the study root's ``config.json``. Its extent,
    ``archs``, ``depths`` and ``trials``, is resumable: a rerun with more trains only the
    new trials. Repeated architectures and depths are dropped (the first kept).

    Raises:
      ValueError: (one line naming the flag) an unknown or no architecture, a depth that
        is not an integer >= 1, any other value out of range.
    """

    STRUCTURAL = STUDY_STRUCTURAL
    # The engine's settings a study does not offer: a trial trains in memory (no workdir:
    # no checkpoints, no TensorBoard files) and silently (one line when it is done).
    NOT_FLAGS = frozenset(
        {"preset", "checkpoint_every_steps", "tensorboard", "log_every", "progress"}
    )

    width: int = width_setting()
    scan_impl: str = scan_impl_setting()
    archs: tuple[str, ...] = setting(
        ("rhn", "dtrnn", "dtsrnn"),
        f"Architectures: any registered cell ({', '.join(cells.ALL_NAMES)}).",
        resumable=True,
    )
    depths: tuple[int, ...] = setting(
        (1, 2, 4, 6), "Recurrence (transition) depths.", resumable=True
    )
    trials: int = setting(
        20,
        "Random-search trials per (architecture, depth); a rerun with "
        "more trains only the new ones.",
        low=1,
        resumable=True,
    )
    preset: str | None = setting(None, "The preset's name, recorded.", resumable=True)
    workdir: str | None = setting(
        None,
        "Output directory (default: runs/jsb_<preset or "
        "full>); rerunning with it skips the finished trials.",
        resumable=True,
    )

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "archs", tuple(dict.fromkeys(self.archs)))
        object.__setattr__(self, "depths", tuple(dict.fromkeys(self.depths)))

    def check(self) -> None:
        super().check()
        unknown = [a for a in self.archs if a not in cells.ALL_NAMES]
        if unknown or not self.archs:
            raise ValueError(
                f"--archs must be a non-empty subset of {list(cells.ALL_NAMES)}, got {unknown}"
            )
        if not self.depths or min(self.depths) < 1:
            raise ValueError(f"--depths: every depth must be >= 1, got {list(self.depths)}")
        check_scan_dtype(self.scan_impl, None)  # float32 only: no pallas
        for arch in self.archs:  # a scan an architecture does not have: one line, up front
            study_model(arch, 1, 1, scan_impl=self.scan_impl)

    def shared(self) -> dict[str, Any]:
        """``{field: value}`` of the settings every trial of the study takes: the
        :class:`TrainSettings` fields, ``width`` and ``scan_impl``."""
        names = [f.name for f in dataclasses.fields(TrainSettings)] + ["width", "scan_impl"]
        return {name: getattr(self, name) for name in names}


@dataclasses.dataclass(frozen=True)
class TrialConfig(PolyphonicConfig):
    """One trial of the study, and how its model trains: an (architecture, depth, trial
    index), its width and parameter count (:func:`rhnzoo.studies.jsb.plan`), its
    hyperparameters (:func:`rhnzoo.studies.jsb.sample_hparams`) and the study's
    :meth:`JSBConfig.shared` settings; :meth:`to_dict` is its workdir's ``config.json``.

    Raises:
      ValueError: (one line) a value out of range (e.g. :class:`PolyphonicConfig`'s).
    """

    STRUCTURAL = STUDY_STRUCTURAL

    width: int = width_setting()
    scan_impl: str = scan_impl_setting()
    arch: str = setting("rhn", "Registered cell (rhnzoo.cells).", choices=cells.ALL_NAMES)
    depth: int = setting(1, "Recurrence (transition) depth.", low=1)
    trial: int = setting(
        0,
        "Index of the random-search draw: the hyperparameters are sample_hparams(seed, trial).",
        low=0,
    )
    hidden: int = setting(
        64,
        "Cell width (plan: the study's width for the RHN, else the "
        "width with the nearest parameter count).",
        low=1,
    )
    params: int = setting(0, "Parameters of the whole model, cell and output layer (plan).", low=0)
    init_scale: float = setting(
        STATIC_INIT["init_scale"], "Uniform half-width of the trial's initial parameters.", low=0
    )
    init_bias: float = setting(
        STATIC_INIT["init_bias"],
        "Initial transform-gate bias of the trial's initial parameters (cells with one).",
    )

    def check(self) -> None:
        super().check()
        check_scan_dtype(self.scan_impl, None)  # float32 only: no pallas

    @property
    def name(self) -> str:
        """Its workdir's name: ``<arch>_d<depth>_t<trial>``."""
        return f"{self.arch}_d{self.depth}_t{self.trial}"


def study_model(
    arch: str, n: int, depth: int, *, scan_impl: str = "reference", **init: float
) -> PianoRollModel:
    """The study's model: cell ``arch`` of width ``n`` and recurrence depth ``depth``,
    ``init`` (``init_scale``, ``init_bias``) over :data:`STATIC_INIT` where it takes them."""
    settings = {"depth": depth, **STATIC_INIT, **init}
    return PianoRollModel(
        cells.make(arch, n, **cells.applicable(arch, settings)), scan_impl=scan_impl
    )


# name -> the settings it changes (flags given explicitly still win).
PRESETS: dict[str, dict[str, Any]] = {
    # 2-core CPU, about 9 minutes (docs/rhn.md): small widths, few trials and epochs.
    "cpu": {"width": 32, "trials": 10, "epochs": 25, "batch_size": 16},
}


def get_config(preset: str | None = None, **overrides: Any) -> JSBConfig:
    """The full study (:class:`JSBConfig`'s defaults), then preset ``preset`` (None: none;
    recorded), then ``overrides`` (e.g. the flags given; lists become tuples).

    Raises:
      ValueError: an unknown preset (one line naming the known ones), an unknown or bad
        setting (one line).
    """
    settings = {**preset_settings(PRESETS, preset), **overrides, "preset": preset}
    return JSBConfig.from_dict(settings)
