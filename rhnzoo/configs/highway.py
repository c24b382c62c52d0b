"""The highway / plain net experiments' settings (``experiments/highway.py``): the
defaults and every preset, as :class:`rhnzoo.tasks.highway.HighwayConfig`.

The defaults are the Columbia ECBM4040 reproduction's (Yarali & Kostic, "Highway
Networks", a reproduction of Srivastava, Greff & Schmidhuber 2015; text in
``shared/papers/001_777c40708440fb61.txt``):

* the nets: a fully connected layer, then 9, 19, 49 or 99 highway or plain layers
  (``depth`` 10, 20, 50, 100) and a softmax layer; 50 units per highway layer and 71 per
  plain layer, "to keep the number of parameters roughly the same";
* highway nets: transform-gate bias -4, momentum 0.9, learning rate 0.1, decayed by 0.96
  every 100,000 steps ("the lowest mean cross-entropy loss was achieved using the
  transform gate bias, momentum, learning rate and the decay rate as -4, 0.9, 0.1 and
  0.96 (decay step = 100,000)");
* plain nets: learning rate 0.001 at depths 10 and 20, 0.00001 at 50 and 100, momentum
  0.9 and decay 0.96 every 100,000 steps for all; tanh (the report's choice after its
  analysis), Glorot uniform initialisation;
* the heatmaps (the report's Fig. 9, Srivastava et al. Fig. 2): T bias -2 on MNIST, -4
  on CIFAR-100; T averaged over 10,000 training images;
* 400 epochs (the report trains its CIFAR-100 highway net for 400; Srivastava et al.'s
  exact settings were on a web page that no longer exists). The batch of 128 is this
  zoo's choice; the report's text does not state one.

Presets (``--preset=NAME``; flags given explicitly still win: :func:`get_config`'s
``overrides``):

* ``cpu``: the whole MNIST sweep (4 depths x 2 kinds, 8 x 120 epochs) on 2 CPU cores in
  about 35 minutes (36.1 measured, shared cores; results in
  ``docs/highway.md``): 120 epochs instead of 400, T bias -4 as for the papers' depth
  curves, the plain rates the reproduction's.
"""

from __future__ import annotations

from typing import Any

from rhnzoo.config import preset_settings
from rhnzoo.tasks.highway import HighwayConfig

# Each preset: the settings it changes from the defaults (HighwayConfig's fields).
PRESETS: dict[str, dict[str, Any]] = {
    "cpu": dict(
        epochs=120, transform_bias=-4.0, plain_lrs=("10:1e-3", "20:1e-3", "50:1e-5", "100:1e-5")
    ),
}


def get_config(preset: str | None = None, **overrides: Any) -> HighwayConfig:
    """The defaults (``preset`` None) or the named preset's settings (its name recorded
    in ``preset``), then ``overrides`` (e.g. the flags given: ``depth=50``) over them.

    Raises:
      ValueError: (one line) for a name not in :data:`PRESETS`, or a bad setting.
    """
    return HighwayConfig(preset=preset, **{**preset_settings(PRESETS, preset), **overrides})
