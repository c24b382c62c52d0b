"""The base of every task's config: a frozen dataclass read from and written to a
run's ``config.json``.

Each task's config (:class:`rhnzoo.training.lm.LMConfig`, ...) subclasses
:class:`Config`; its presets live in ``rhnzoo/configs/<task>.py``
(``get_config(preset)``, through :func:`preset_settings`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

C = TypeVar("C", bound="Config")


@dataclasses.dataclass(frozen=True)
class Config:
    """A frozen, checked settings record.

    Subclasses declare fields with defaults and override :meth:`check` to raise a
    one-line ``ValueError`` naming the flag for a value out of range; it runs on
    construction, so a config that exists is a valid one.
    """

    # Keys added to the task's config.json after its first runs: written only where they
    # differ from their default, so that earlier workdirs (without them) still resume.
    ADDED_KEYS: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        self.check()

    def check(self) -> None:
        """Raises ValueError (one line) for a setting out of range; the base checks
        nothing."""

    @classmethod
    def from_dict(cls: type[C], values: Mapping[str, Any], *, strict: bool = True) -> C:
        """The config of ``values`` (e.g. a run's ``config.json``); missing keys take
        their defaults.

        Raises:
          ValueError: with ``strict``, keys that are not fields (one line naming
            them); any :meth:`check` failure.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown and strict:
            raise ValueError(f"unknown {cls.__name__} setting(s): {', '.join(unknown)}")
        return cls(**{k: v for k, v in values.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        """``{field: value}``, the inverse of :meth:`from_dict` (tuples stay tuples), but
        an :attr:`ADDED_KEYS` field at its default left out."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in self.ADDED_KEYS or getattr(self, f.name) != f.default}

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` (checked)."""
        return dataclasses.replace(self, **changes)


def preset_settings(presets: Mapping[str, Any], name: str | None) -> Any:
    """``presets[name]``, the settings of preset ``name`` (None: no preset, ``{}``).

    Raises:
      ValueError: ``--preset must be one of <names>, got <name>`` (one line).
    """
    if name is None:
        return {}
    if name not in presets:
        raise ValueError(f"--preset must be one of {', '.join(presets)}, got {name!r}")
    return presets[name]
