"""The highway / plain net experiments' settings (``experiments/highway.py``):
:class:`HighwayConfig` (one net's settings and the depth sweep's flags, ``config.json``)
and its presets; the sweep's runs are :mod:`rhnzoo.studies.highway`'s.

The defaults are the Columbia ECBM4040 reproduction's (Yarali & Kostic, "Highway
Networks", a reproduction of Srivastava, Greff & Schmidhuber 2015; text in
``shared/papers/001_777c40708440fb61.txt``; the nets in docs/highway.md): 50 units per
highway layer and 71 per plain layer, "to keep the number of parameters roughly the same";
for highway nets "the lowest mean cross-entropy loss was achieved using the transform gate
bias, momentum, learning rate and the decay rate as -4, 0.9, 0.1 and 0.96 (decay step =
100,000)"; plain nets at the report's per-depth rates (:data:`PLAIN_LRS`), momentum 0.9
and the same decay, tanh, Glorot uniform; 400 epochs (the report trains its CIFAR-100
highway net for 400; Srivastava et al.'s exact settings were on a web page that no longer
exists); for the heatmaps (the report's Fig. 9) T bias -2 on MNIST, -4 on CIFAR-100. The
batch of 128 is this zoo's choice; the report's text does not state one.

Presets (``--preset=NAME``; flags given explicitly still win): ``cpu``, the whole MNIST
sweep (4 depths x 2 kinds, 120 epochs instead of 400) on 2 CPU cores in about 35 minutes
(docs/highway.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from rhnzoo import data
from rhnzoo.config import DataSettings, RunSettings, preset_settings, setting
from rhnzoo.models.highway import ACTIVATIONS, INITS, KINDS, FeedForwardNet

HIGHWAY_LR = 0.1  # the reproduction's learning rate of every highway net
DEFAULT_WIDTH = {"highway": 50, "plain": 71}  # about 5,000 parameters per layer either way
PLAIN_LRS = {10: 1e-3, 20: 1e-3, 50: 1e-5, 100: 1e-5}  # the reproduction's plain-net rates


def parse_plain_lrs(value: str | Sequence[str] | Mapping[Any, Any]) -> dict[int, float]:
    """``{depth: rate}`` of ``--plain_lrs``: depth:rate pairs comma-separated
    (``'10:0.1,20:0.05'``) or one an item (an older ``config.json``), or a mapping (a
    ``config.json``'s, its keys strings).

    Raises:
      ValueError: ``--plain_lrs must be depth:rate pairs, got [...]`` (one line) for a
        pair that is not an integer depth and a number.
    """
    shown = value
    try:
        if isinstance(value, Mapping):
            shown, pairs = dict(value), list(value.items())
        else:
            shown = value.split(",") if isinstance(value, str) else list(value)
            pairs = [item.split(":") for item in shown]
        return {int(depth): float(rate) for depth, rate in pairs}
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"--plain_lrs must be depth:rate pairs, got {shown!r}") from None


def format_plain_lrs(rates: Mapping[int, float]) -> str:
    """``rates`` as ``--plain_lrs`` spells them: ``'10:0.001,20:0.001'``."""
    return ",".join(f"{depth}:{rate:g}" for depth, rate in rates.items())


@dataclasses.dataclass(frozen=True)
class HighwayConfig(RunSettings, DataSettings):
    """The settings of one highway / plain net run, one field each, and the flags of the
    depth sweep (``sweep``, ``depths``; ``--jobs`` and ``--seeds`` are the runner's).

    A run's config is :meth:`narrow`-ed (kind, depth, width and learning rate resolved,
    no sweep; a sweep's runs: :func:`rhnzoo.studies.highway.runs`) and its ``to_dict()`` is
    the run's ``config.json``: the sweep-level fields (``sweep``, ``depths``,
    ``plain_lrs``) are resumable, the net's ``kind``, ``depth``, ``width``, ``lr`` structural.

    Raises:
      ValueError: on construction (one line naming the flag, as the script prints it):
        a value out of range, or (not a sweep) a plain net without a learning rate. A
        sweep's nets (``depths`` x both kinds, their rates) are checked by the study
        (:func:`rhnzoo.studies.highway.check`), as the script reads its flags.
    """

    # ``--plain_lrs`` is the script's own flag (depth:rate pairs, parse_plain_lrs): a
    # mapping is no flag type of rhnzoo.apps.cli.define_config_flags.
    NOT_FLAGS = frozenset({"preset", "plain_lrs"})

    # the net
    kind: str = setting("highway", "Net.", choices=KINDS)
    depth: int = setting(
        10,
        "Hidden layers in all (>= 2): the first plain layer and depth - 1 highway or plain layers.",
        low=2,
    )
    width: int | None = setting(
        None, "Units per layer (default 50 for highway, 71 for plain).", low=1
    )
    activation: str = setting("tanh", "H and plain-layer nonlinearity.", choices=tuple(ACTIVATIONS))
    init: str = setting("glorot_uniform", "Weight initialisation.", choices=sorted(INITS))
    transform_bias: float = setting(
        -4.0,
        "Initial transform-gate bias b_T (papers: -1 to "
        "-10; -2 for the MNIST heatmaps, -4 for the depth "
        "curves).",
    )
    # the data
    dataset: str = setting("mnist", "Data set.", choices=data.names("images"))
    data_source: str = setting(
        "files",
        "The original idx / python pickle files, or "
        "TensorFlow Datasets (pip install 'rhnzoo[tfds]').",
        choices=data.SOURCES,
    )
    valid_size: int = setting(10000, "Last training images held out for validation.", low=1)
    # the optimisation
    lr: float | None = setting(
        None,
        f"Initial learning rate (default: {HIGHWAY_LR} for "
        "highway nets, --plain_lrs at the depth for plain nets).",
    )
    plain_lrs: dict[int, float] = setting(
        PLAIN_LRS,
        "depth:rate pairs, the plain nets' learning rates when --lr is not given.",
        resumable=True,
    )
    momentum: float = setting(0.9, "SGD momentum, in [0, 1).", low=0)
    lr_decay_rate: float = setting(
        0.96, "Learning-rate factor every --lr_decay_steps, in (0, 1].", gt=0, high=1
    )
    lr_decay_steps: int = setting(100_000, "Steps between learning-rate decays.", low=1)
    batch_size: int = setting(
        128, "Images per SGD step (an epoch's last partial batch is dropped).", low=1
    )
    eval_batch_size: int = setting(1000, "Images per evaluation call.", low=1, resumable=True)
    epochs: int = setting(400, "Training epochs (the papers: 400).", low=1)
    # the sweep (its runs: rhnzoo.studies.highway.runs) and the analyses
    sweep: bool = setting(
        False,
        "Train every --depths x (plain, highway), then write the table and figures.",
        resumable=True,
    )
    depths: tuple[str, ...] = setting(
        ("10", "20", "50", "100"), "Depths of --sweep.", resumable=True
    )
    analyze: bool = setting(
        True,
        "After training a highway net, write its gate heatmaps and lesioning figure.",
        resumable=True,
    )
    heatmap_examples: int = setting(
        10000, "Training images averaged in the mean-T heatmap.", low=1, resumable=True
    )
    lesion_examples: int = setting(
        10000, "Training images of the lesioning study.", low=1, resumable=True
    )
    diagnostics_depth: int = setting(
        50,
        "Depth of the plain nets of the sweep's activation / "
        "gradient diagnostics (0: skip; else >= 2).",
        low=0,
        resumable=True,
    )
    workdir: str | None = setting(
        None,
        "Run directory (a sweep's root); rerunning with it resumes (default: "
        "runs/highway_<dataset>_<kind>_d<depth>, a sweep's runs/highway_<dataset>_<preset "
        "or full>).",
        resumable=True,
    )
    preset: str | None = setting(None, "The preset's name, recorded.", resumable=True)

    def __post_init__(self):
        object.__setattr__(self, "plain_lrs", parse_plain_lrs(self.plain_lrs))
        super().__post_init__()

    def check(self) -> None:
        super().check()  # the run settings'
        if not self.sweep:  # its net and learning rate (a sweep's: the study's check)
            self.check_net(self.kind, self.depth)
        if not self.momentum < 1:
            raise ValueError(f"--momentum must be in [0, 1), got {self.momentum}")
        if self.diagnostics_depth == 1:
            raise ValueError("--diagnostics_depth must be 0 or >= 2, got 1")

    def check_net(self, kind: str, depth: int) -> None:
        """Raises ValueError (one line naming the flag) unless the ``kind`` net of
        ``depth`` can be made from these settings (:meth:`net`) and has a learning rate
        > 0 (:meth:`learning_rate`)."""
        self.net(kind, depth)
        lr = self.learning_rate(kind, depth)
        if not lr > 0:
            raise ValueError(f"--lr must be > 0, got {lr}")

    def learning_rate(self, kind: str, depth: int) -> float:
        """The initial learning rate of a ``kind`` net of ``depth``: ``lr`` if given, else
        :data:`HIGHWAY_LR` or the plain rate at the depth. Raises ValueError for a plain
        depth without a rate."""
        if self.lr is not None:
            return self.lr
        if kind == "highway":
            return HIGHWAY_LR
        if depth not in self.plain_lrs:
            raise ValueError(
                f"no plain learning rate for depth {depth} in --plain_lrs "
                f"({format_plain_lrs(self.plain_lrs)}); pass --lr or add {depth}:rate"
            )
        return self.plain_lrs[depth]

    def net(self, kind: str | None = None, depth: int | None = None) -> FeedForwardNet:
        """The :class:`FeedForwardNet` of ``kind`` and ``depth`` (default: the config's),
        sized for ``dataset``. Raises ValueError (its one line) for a bad setting."""
        kind = self.kind if kind is None else kind
        depth = self.depth if depth is None else depth
        spec = data.DATASETS[self.dataset]
        width = DEFAULT_WIDTH[kind] if self.width is None else self.width
        return FeedForwardNet(
            kind,
            depth,
            width,
            spec.input_size,
            spec.num_classes,
            self.activation,
            self.init,
            self.transform_bias,
        )

    def narrow(
        self, kind: str | None = None, depth: int | None = None, **changes: Any
    ) -> HighwayConfig:
        """The config of one run: the ``kind`` net of ``depth`` (default: the config's)
        with its width and learning rate resolved, no sweep (``depths`` its depth);
        ``changes`` (e.g. ``seed``, ``workdir``) applied. Its ``to_dict()`` is the run's
        ``config.json``. Raises ValueError (one line) as :meth:`check_net`."""
        kind = self.kind if kind is None else kind
        depth = self.depth if depth is None else depth
        return self.replace(
            kind=kind,
            depth=depth,
            width=self.net(kind, depth).width,
            lr=self.learning_rate(kind, depth),
            sweep=False,
            depths=(str(depth),),
            **changes,
        )

    def output_dir(self) -> str:
        """``workdir``, else the default: ``runs/highway_<dataset>_<preset or full>`` for a
        sweep (its root), ``runs/highway_<dataset>_<kind>_d<depth>`` for one net."""
        if self.workdir:
            return self.workdir
        if self.sweep:
            return f"runs/highway_{self.dataset}_{self.preset or 'full'}"
        return f"runs/highway_{self.dataset}_{self.kind}_d{self.depth}"


# Each preset: the settings it changes from the defaults (HighwayConfig's fields).
PRESETS: dict[str, dict[str, Any]] = {
    "cpu": dict(epochs=120, transform_bias=-4.0, plain_lrs=PLAIN_LRS),
}


def get_config(preset: str | None = None, **overrides: Any) -> HighwayConfig:
    """The defaults (``preset`` None) or the named preset's settings (its name recorded
    in ``preset``), then ``overrides`` (e.g. the flags given: ``depth=50``) over them.

    Raises:
      ValueError: (one line) for a name not in :data:`PRESETS`, or a bad setting.
    """
    return HighwayConfig(preset=preset, **{**preset_settings(PRESETS, preset), **overrides})
