"""The one multi-run runner: named configurations, one workdir each, one table.

Every multi-run experiment (the HSG depth sweep, the highway ``--sweep``, the RRL
``--table`` and recipe ``--study``, the JSB random search) is a list of :class:`Run`:
a name (its workdir under the root), the settings that go to ``config.json``, and a
function that trains in a workdir through :func:`rhnzoo.training.engine.run` and
returns its results. :func:`run_all` checks every existing workdir against its settings
before any training (an incompatible one stops the sweep with one line), then trains
the runs in order; what a finished run does (say ``already finished``, extend a run
whose length grew) is the engine's behaviour, the same as for a single run.
:func:`collect` reads the workdirs back and :func:`markdown` lays out the table.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rhnzoo.training import engine

PathLike = str | pathlib.Path


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a sweep.

    Attributes:
      name: the workdir's name under the sweep's root (a path component, no ``/``).
      config: the run's settings as written to ``config.json``.
      train: ``train(workdir) -> results`` (``results.json``'s content).
    """

    name: str
    config: Mapping[str, Any]
    train: Callable[[pathlib.Path], Mapping[str, Any] | None]

    def __post_init__(self):
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ValueError(f"run name must be one path component, got {self.name!r}")


def run_all(
    runs: Sequence[Run], root: PathLike, *, log: Callable[[str], None] | None = print,
    resumable_keys=engine.RESUMABLE_KEYS,
) -> dict[str, Mapping[str, Any] | None]:  # fmt: skip
    """Trains ``runs`` one after another, each in ``root/<name>``.

    Returns:
      ``{name: results}`` in the order of ``runs``.

    Raises:
      ValueError: duplicate names, or an existing workdir holding other settings
        (checked for every run before the first one trains).
      Whatever a run's ``train`` raises (``Interrupted`` on a signal, ...).
    """
    root = pathlib.Path(root)
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate run names in {names}")
    for r in runs:
        if (root / r.name / "config.json").is_file():
            engine.prepare_workdir(root / r.name, r.config, resumable_keys, check_only=True)
    say = log or (lambda line: None)
    out = {}
    for i, r in enumerate(runs, 1):
        say(f"[{i}/{len(runs)}] {r.name} -> {root / r.name}")
        out[r.name] = r.train(root / r.name)
    return out


def in_memory(compute: Callable[[], Mapping[str, Any]], config: Mapping[str, Any],
              resumable_keys=engine.RESUMABLE_KEYS) -> Callable[[pathlib.Path], Mapping[str, Any]]:  # fmt: skip
    """A :attr:`Run.train` for a run that keeps nothing but its results (a random-search
    trial trained in memory, no checkpoints): a workdir holding ``results.json`` is
    finished and its results are returned; otherwise ``compute()`` runs and then
    ``config.json`` and ``results.json`` are written (a run killed midway leaves nothing
    and runs again)."""

    def train(workdir: pathlib.Path) -> Mapping[str, Any]:
        path = pathlib.Path(workdir) / "results.json"
        if path.is_file():
            return json.loads(path.read_text())
        results = compute()
        engine.prepare_workdir(workdir, config, resumable_keys)
        engine.write_json(path, results)
        return results

    return train


def collect(root: PathLike, names: Sequence[str]) -> dict[str, dict[str, Any] | None]:
    """What the workdirs ``root/<name>`` hold: ``{name: {'config', 'results', 'history'}}``
    (``results`` None while unfinished); None for a workdir that does not exist."""
    root = pathlib.Path(root)
    out = {}
    for name in names:
        wd = root / name
        if not (wd / "config.json").is_file():
            out[name] = None
            continue
        results = wd / "results.json"
        out[name] = {
            "config": json.loads((wd / "config.json").read_text()),
            "results": json.loads(results.read_text()) if results.is_file() else None,
            "history": engine.read_metrics(wd),
        }
    return out


def markdown(header: Sequence[str], rows: Sequence[Sequence[Any]], blank: str = "—") -> str:
    """A markdown table; None cells print as ``blank``."""
    cell = lambda v: blank if v is None else str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
