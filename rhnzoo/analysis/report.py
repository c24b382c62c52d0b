"""What ``experiments/analyze.py`` draws for a trained run, by the kind of run.

The data set and the model come from the run's ``config.json``: its ``dataset`` names an
entry of :data:`rhnzoo.data.DATASETS`, whose task says what the run is.

* language models (PTB, PTB-char, text8, enwik8; any cell): T-gate heatmap (Zilly et
  al. Fig. 5b) and lesions (sec. 6) for RHN cells, the HSG gate histogram (Shoham &
  Permuter Fig. 7) for HSG(RHN), MC-dropout evaluation for any cell;
* feed-forward highway nets (MNIST, CIFAR-100): gate heatmaps and lesions
  (Srivastava et al. Figs. 2-4);
* sequence classifiers (IMDB, P-MNIST, AG News, 20NG): the information-flow figures of
  the run's cell (``flow=True``).

:func:`flow_figures` draws the gradient flow of every cell family at initialisation, and
for a recurrent run its trained cell's gradient flow and Gersgorin discs
(:mod:`rhnzoo.analysis.flow`).

Each analysis runs as named phases (:class:`Phases`: e.g. ``gate_heatmap``, ``lesion``,
``hsg_gate``, ``deterministic``, ``mc_dropout``; how they are announced, timed, kept from
an earlier analysis of the same checkpoint (``redo``: run again) and stopped is said
there), the JSON file (``analysis.json``, ``flow.json``) rewritten atomically after each.
SIGTERM/SIGINT (:func:`rhnzoo.engine.signals.catch_signals`) stops the analysis at the
next chunk (evaluation window, batch, cell): the stopped phase is marked ``interrupted``
with the numbers of its finished units (a lesion study's finished lesions, the cell
families drawn so far; nothing of an unfinished MC-dropout or gate computation), and
:class:`~rhnzoo.engine.signals.Interrupted` propagates (exit status 128 + signal in
``experiments/analyze.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import pathlib
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from rhnzoo import cells, data, dropout, evaluation
from rhnzoo.analysis import flow, plots
from rhnzoo.analysis import lm as lm_analysis
from rhnzoo.config import SEED_HIGH, Config, setting, strict
from rhnzoo.engine import signals
from rhnzoo.engine import workdir as workdir_lib


@dataclasses.dataclass(frozen=True)
class AnalysisOptions(Config):
    """The settings of the analyses (``experiments/analyze.py``'s flags, one field each).

    Raises:
      ValueError: (one line, named as the flag) for a count below its least value, e.g.
        ``lesion_tokens=-1`` or ``max_eval_tokens=0`` (``None`` means every token), and
        for a ``seed`` outside 0 to :data:`rhnzoo.config.SEED_HIGH`.
    """

    NOT_FLAGS = frozenset({"track"})  # set by the code, not a setting

    split: str = setting("valid", "Split for gates and MC.", choices=("train", "valid", "test"))
    mc_samples: int = setting(0, "MC-dropout passes K (0: skip MC evaluation).", low=0)
    mc_batch_size: int = setting(1, "Rows of the MC evaluation (1: reference).", low=1)
    max_eval_tokens: int | None = setting(
        None, "Evaluate only the first N tokens of --split.", low=1
    )
    eval_num_steps: int = setting(200, "Window length of evaluation scans.", low=1)
    lesion_tokens: int = setting(20000, "Training tokens for the lesion study.", low=1)
    lesion_batch_size: int = setting(20, "Rows of the lesion evaluation.", low=1)
    heatmap_steps: int = setting(40, "Time steps shown in the gate heatmap.", low=1)
    hist_tokens: int = setting(2000, "Tokens of --split run for the HSG histogram.", low=1)
    hist_times: int = setting(200, "Random time steps in the HSG histogram.", low=1)
    seed: int = setting(
        0,
        f"Seed of the MC masks and the histogram's time steps: 0 to {SEED_HIGH}.",
        low=0,
        high=SEED_HIGH,
    )
    data_dir: str | None = setting(None, "Data directory (default: the run's data_dir setting).")
    verify: bool = setting(True, "Check the data files' sha256 (off for your own corpora).")
    flow_hidden: int = setting(64, "Units of the cells compared at initialisation.", low=1)
    flow_steps: int = setting(100, "Time steps T of the gradient-flow sequences.", low=1)
    flow_tokens: int = setting(50, "Tokens read before the Gersgorin Jacobian is taken.", low=1)
    heatmap_examples: int = setting(1000, "Highway runs: images in the gate heatmap.", low=1)
    lesion_examples: int = setting(10000, "Highway runs: images in the lesion study.", low=1)
    progress: bool = setting(True, "Show progress bars (with an ETA) for the long phases.")
    redo: bool = setting(
        False,
        "Recompute the phases an earlier analysis of the same "
        "checkpoint finished with the same settings (default: keep them).",
    )
    # The engine's progress/signal tracker for long evaluations (not a setting); None:
    # rhnzoo.engine.signals.track with ``progress``.
    track: Any = dataclasses.field(default=None)


# The cell families compared at initialisation: label -> (registered cell, its settings),
# each with its own default initialisation (rhnzoo.cells.make).
FAMILIES = {
    "RHN depth 1": ("rhn", {"depth": 1}),
    "RHN depth 5": ("rhn", {"depth": 5}),
    "RHN depth 10": ("rhn", {"depth": 10}),
    "HSG-RHN depth 5": ("hsg_rhn", {"depth": 5}),
    "DT-RNN depth 5": ("dtrnn", {"depth": 5}),
    "LSTM": ("lstm", {}),
    "GRU": ("gru", {}),
    "RRN": ("rrn", {}),
    "SC-LSTM (L=20)": ("sc_lstm_i", {"skip": 20}),
    "HRL": ("hrl", {}),
}


def run_kind(config: dict) -> str:
    """``'lm'``, ``'images'`` or ``'sequences'``: the task of the run's data set (a run
    without ``dataset`` is a PTB run from before it was recorded)."""
    name = config.get("dataset", "ptb")
    if name not in data.DATASETS:
        raise ValueError(f"the run's data set {name!r} is not in the registry")
    return data.DATASETS[name].task


def _data_dir(config: dict, opts: AnalysisOptions):
    return opts.data_dir or config.get("data_dir")


def _settings(opts: AnalysisOptions, *names: str, **more: Any) -> dict[str, Any]:
    """The options named (and ``more``) that a phase's numbers depend on (:meth:`Phases.kept`)."""
    return {**{name: getattr(opts, name) for name in names}, **more}


def _is_rhn(cell) -> bool:
    return isinstance(cell.cell if isinstance(cell, cells.HSG) else cell, cells.RHN)


# ------------------------------------------------------------------ phases


WARMUP_ITEMS = 2  # a phase's first items are not timed (compilations)
ESTIMATE_ITEMS = 3  # timed items before a phase's time left is printed


def _about(seconds: float) -> str:
    """``'about 40 s'``, ``'about 3 min'``, ``'about 2.5 h'``."""
    if seconds < 90:
        return f"about {seconds:.0f} s"
    return f"about {seconds / 60:.0f} min" if seconds < 5400 else f"about {seconds / 3600:.1f} h"


# The keys of Phases.results that are the analysis' own, never a phase's numbers.
_META = ("complete", "phases", "interrupted", "checkpoint")


class Phases:
    """The phases of one analysis, run in order, and the numbers they gather (:attr:`results`).

    ``with phases(name, what, unit) as track:`` runs one phase: it prints
    ``'<name>: <what>'``; the phase's long loops iterate with ``track`` (``opts.track``,
    else :func:`rhnzoo.engine.signals.track` with a bar when ``opts.progress``; a
    signal check before every item), which prints ``'  <name>: about 3 min left (...)'``
    once a few items (``unit``) after the first ones (the compilations) are timed.
    ``results['phases'][name]`` records ``{'status': 'done' | 'interrupted', 'seconds',
    'figures', 'settings', 'keys'}`` (figures: the files :meth:`wrote` names; settings:
    those :meth:`kept` was given; keys: the top-level entries of ``results`` the phase
    wrote). After each finished phase ``results`` (``'complete': False`` until
    :meth:`finish`) is written to every path of ``paths``, atomically
    (:func:`rhnzoo.engine.workdir.write_json`).

    An earlier analysis in the first path is taken up by :meth:`resume`; a phase site asks
    :meth:`kept` first and runs the phase only if it returns False.

    On SIGTERM/SIGINT (between items, or before a phase starts) the phase is marked
    ``'interrupted'`` (with ``'signal'``), ``results['interrupted'] = {'phase', 'signal'}``,
    the files are written with what the phases put into ``results`` so far, one line
    says so, and :class:`~rhnzoo.engine.signals.Interrupted` propagates. A phase that an
    earlier analysis had finished (run again by ``redo`` or other settings) keeps that
    earlier record and numbers instead of the partial ones.
    """

    def __init__(self, paths: Sequence[pathlib.Path], opts: AnalysisOptions):
        self.paths = list(paths)
        self.results: dict[str, Any] = {"complete": False, "phases": {}}
        self._track = opts.track or functools.partial(signals.track, progress=opts.progress)
        self._record: dict[str, Any] = {}
        self._redo = opts.redo
        self._settings: dict[str, dict] = {}  # phase -> the settings kept() was given

    def resume(self, checkpoint: dict[str, Any] | None) -> None:
        """Takes up the analysis in the first path (if any) when it read ``checkpoint``
        (:func:`checkpoint_used`; None: a figure of no run): its phases and their
        numbers become this analysis' starting point, so a phase this run does not
        redo stays in the file. Another checkpoint's analysis is replaced (one line
        says so); an unreadable file is replaced too."""
        if not self.paths:
            return
        path = self.paths[0]
        try:
            earlier = workdir_lib.read_json(path)
        except ValueError as e:
            print(f"{e}: replaced", flush=True)
            return
        if not isinstance(earlier, dict) or not isinstance(earlier.get("phases"), dict):
            return
        if earlier.get("checkpoint") != checkpoint:

            def name(c):
                return "no checkpoint" if c is None else f"{c['kind']} step {c['step']}"

            print(
                f"{path} holds an analysis of {name(earlier.get('checkpoint'))}, this one "
                f"reads {name(checkpoint)}: its phases are replaced",
                flush=True,
            )
            return
        self.results.update({k: v for k, v in earlier.items() if k not in _META})
        self.results["phases"] = dict(earlier["phases"])

    def kept(self, name: str, settings: dict[str, Any]) -> bool:
        """Whether phase ``name`` with ``settings`` (the options its numbers depend on)
        is kept from the earlier analysis (:meth:`resume`): done there with equal
        settings, its figures still beside the file, and no ``redo``. Then it prints
        ``'<name>: kept from the earlier analysis of this checkpoint ...'`` and the
        phase must not run; else the next ``phases(name, ...)`` records ``settings``."""
        settings = json.loads(json.dumps(strict(settings)))
        self._settings[name] = settings
        record = self.results["phases"].get(name)
        if (
            self._redo
            or not isinstance(record, dict)
            or record.get("status") != "done"
            or record.get("settings") != settings
            or "keys" not in record
        ):
            return False
        folder = self.paths[0].parent
        if not all((folder / f).is_file() for f in record.get("figures", [])):
            return False
        self.results["phases"][name] = self.results["phases"].pop(name)  # this run's order
        shown = ", ".join(record.get("figures", [])) or "its numbers"
        print(
            f"{name}: kept from the earlier analysis of this checkpoint ({shown}; --redo "
            "recomputes it)",
            flush=True,
        )
        return True

    def _written(self, before: dict[str, Any]) -> list[str]:
        """The top-level keys of :attr:`results` set since the shallow copy ``before``."""
        return [
            k
            for k, v in self.results.items()
            if k not in _META and (k not in before or before[k] is not v)
        ]

    @contextlib.contextmanager
    def __call__(self, name: str, what: str, unit: str = "chunks") -> Iterator[signals.Track]:
        print(f"{name}: {what}", flush=True)
        earlier = self.results["phases"].pop(name, None)
        earlier_numbers = {
            k: self.results.pop(k) for k in (earlier or {}).get("keys", []) if k in self.results
        }
        before = dict(self.results)
        record = self._record = self.results["phases"][name] = {
            "status": "running",
            "figures": [],
            "settings": self._settings.pop(name, {}),
        }
        t0 = time.perf_counter()
        try:
            if signals.stop_requested() is not None:
                raise signals.Interrupted(signals.stop_requested())
            yield functools.partial(self._timed, name, unit)
        except signals.Interrupted as e:
            partial = self._written(before)
            if isinstance(earlier, dict) and earlier.get("status") == "done":
                for k in partial:  # an earlier finished result beats this partial one
                    del self.results[k]
                self.results.update(earlier_numbers)
                self.results["phases"][name] = earlier
                left = f"{name} as the earlier analysis left it"
            else:
                record.update(
                    status="interrupted",
                    signal=e.signum,
                    keys=partial,
                    seconds=time.perf_counter() - t0,
                )
                left = f"{name} marked interrupted"
            self.results["interrupted"] = {"phase": name, "signal": e.signum}
            self._write()
            done = [
                n for n, r in self.results["phases"].items() if r["status"] == "done" and n != name
            ]
            files = ", ".join(map(str, self.paths)) or "nothing"
            print(
                f"stopped by signal {e.signum} in phase {name}: wrote {files} with the phases "
                f"done ({', '.join(done) or 'none'}) and {left}",
                flush=True,
            )
            raise
        record.update(status="done", seconds=time.perf_counter() - t0, keys=self._written(before))
        self._write()

    def _timed(
        self, name: str, unit: str, iterable: Iterable, total: int | None = None, desc: str = ""
    ) -> Iterator:
        """The phase's tracker: the bar named ``name``; once :data:`ESTIMATE_ITEMS` items
        after the first :data:`WARMUP_ITEMS` (compilations) are timed, and more are left,
        the time left: their median time x the items left."""
        del desc
        durations, last = [], None
        for i, item in enumerate(self._track(iterable, total=total, desc=name)):
            now = time.perf_counter()
            if i > WARMUP_ITEMS:
                durations.append(now - last)
            if len(durations) == ESTIMATE_ITEMS and total and total > i:
                each = float(np.median(durations))
                tqdm.write(
                    f"  {name}: {_about(each * (total - i))} left ({total - i:,} of "
                    f"{total:,} {unit} to go, {each:.3g} s each)"
                )
            last = now
            yield item

    def wrote(self, path: pathlib.Path) -> None:
        """Prints ``'wrote <path>'`` and records the file among the phase's figures."""
        print(f"wrote {path}", flush=True)
        self._record["figures"].append(pathlib.Path(path).name)

    def _write(self) -> None:
        for path in self.paths:
            workdir_lib.write_json(path, self.results)

    def finish(self) -> dict[str, Any]:
        """Marks the analysis complete, writes the files and returns :attr:`results`."""
        self.results["complete"] = True
        self.results.pop("interrupted", None)
        self._write()
        return self.results


def checkpoint_used(workdir: pathlib.Path) -> dict[str, Any] | None:
    """The checkpoint whose parameters the analyses read
    (:func:`rhnzoo.engine.workdir.restore_params`): ``{'kind': 'best', 'step': N,
    'path'}``, the latest step in ``best/``, else ``{'kind': 'latest', ...}``, the latest
    in ``checkpoints/`` (no validation has saved a best yet); None if neither has a step.
    Steps are the directories named by an integer (orbax's finished saves)."""
    for kind, directory in (("best", "best"), ("latest", "checkpoints")):
        path = pathlib.Path(workdir) / directory
        steps = [int(p.name) for p in path.iterdir() if p.name.isdigit()] if path.is_dir() else []
        if steps:
            return {"kind": kind, "step": max(steps), "path": str(path / str(max(steps)))}
    return None


def _note_checkpoint(workdir: pathlib.Path, results: dict) -> None:
    """Prints which checkpoint the analyses read and records it as ``results['checkpoint']``
    (once)."""
    used = checkpoint_used(workdir)
    if used is None or "checkpoint" in results:
        return
    results["checkpoint"] = used
    why = (
        "best validation"
        if used["kind"] == "best"
        else "no validation has happened yet: best/ holds no step"
    )
    print(f"checkpoint: {used['kind']} at step {used['step']} ({why}): {used['path']}")


# ------------------------------------------------------------------ the run's cell


def run_cell(workdir: pathlib.Path, opts: AnalysisOptions, length: int):
    """``(label, cell, init_params, trained_params, xs_trained, xs_init)`` of a recurrent
    run: the cell at initialisation and trained, and the first ``length`` steps of the
    first ``opts.split`` sequence as their inputs ``[T, 1, m]`` (embedded by the trained
    and the initial embedding of a language model; by the trained one of a classifier)."""
    config = workdir_lib.read_config(workdir)
    kind = run_kind(config)
    seed = int(config.get("seed", 0))
    if kind == "lm":
        model, trained, config = lm_analysis.load_run(workdir)
        corpus = data.load(
            config.get("dataset", "ptb"),
            _data_dir(config, opts),
            download=False,
            verify=opts.verify,
        )
        init = model.init(jax.random.split(jax.random.PRNGKey(seed))[0])
        tokens = np.asarray(getattr(corpus, opts.split)[:length])
        embed = lambda p: p["embed"][tokens][:, None, :]
        return (
            lm_analysis.run_label(config),
            model.cell,
            init["cell"],
            trained["cell"],
            embed(trained),
            embed(init),
        )
    if kind == "sequences":
        from rhnzoo.configs import rrl as rrl_configs

        name = config.get("model")
        if name is None:
            raise ValueError(f"{workdir}/config.json names no model")
        cell = rrl_configs.RRLConfig.from_dict(config).cell()
        trained = workdir_lib.restore_params(workdir)
        if trained is None:
            raise ValueError(f"{workdir} has no checkpoint; train it first")
        trained = jax.tree.map(jax.numpy.asarray, trained)
        input_size = (
            trained["embed"].shape[1]
            if "embed" in trained
            else data.DATASETS[config["dataset"]].input_size
        )
        kc = jax.random.split(jax.random.split(jax.random.PRNGKey(seed))[0], 3)[1]
        init_cell = cell.init(kc, input_size)
        dataset = data.load_dataset(
            config["dataset"], data_dir=_data_dir(config, opts), download=False, verify=opts.verify
        )
        split = {"valid": dataset.dev, "train": dataset.train, "test": dataset.test}[opts.split]
        seq = np.asarray(split.inputs[0])[:length]
        if "embed" in trained:  # the trained embedding feeds both cells
            xs = trained["embed"][seq][:, None, :]
        else:
            xs = jax.numpy.asarray(seq, jax.numpy.float32).reshape(len(seq), 1, -1)
        label = f"{cells.label(name) if name in cells.ALL_NAMES else name} ({config['dataset']})"
        return label, cell, init_cell, trained["cell"], xs, xs
    raise ValueError(
        f"{workdir} is a feed-forward run ({config.get('dataset')}); the flow "
        "figures need a recurrent one"
    )


def flow_figures(
    workdir: pathlib.Path | None,
    out: pathlib.Path,
    opts: AnalysisOptions,
    phases: Phases | None = None,
) -> dict:
    """gradient_flow.png (and gersgorin.png for a run); returns the numbers.

    Phases (:class:`Phases`): ``gradient_flow``, every family of :data:`FAMILIES` at
    initialisation (one bar item per family; gradient_flow.png), then, with a ``workdir``,
    ``run_flow``, the run's cell at initialisation and trained (their curves added to
    gradient_flow.png; gersgorin.png). ``phases``: the analysis' own (its caller finishes
    it); None: new ones writing ``out/flow.json``.

    Raises:
      Interrupted: on a signal, after writing the numbers of the phases done (and of the
        cell families finished) into the JSON file.
    """
    own = phases is None
    if own:
        phases = Phases([out / "flow.json"], opts)
        phases.resume(checkpoint_used(workdir) if workdir is not None else None)
    results = phases.results
    n, steps, batch, m = opts.flow_hidden, opts.flow_steps, 4, 32
    results.update(hidden=n, steps=steps, batch=batch, input=m)
    curves: dict[str, np.ndarray] = {}
    title = f"Gradient flow: cells at initialisation ({n} units)"
    kept = phases.kept("gradient_flow", _settings(opts, "flow_hidden", "flow_steps", "seed"))
    if kept:
        curves = {label: np.asarray(c) for label, c in results["gradient_norms_at_init"].items()}
    else:
        _gradient_flow(out, opts, phases, curves, title)
    if workdir is not None:
        _run_flow(workdir, out, opts, phases, curves, title + " and a trained run", redraw=not kept)
    if own:
        phases.finish()
        print(f"wrote {out / 'flow.json'}")
    return results


def _gradient_flow(
    out: pathlib.Path, opts: AnalysisOptions, phases: Phases, curves: dict, title: str
) -> None:
    """Phase ``gradient_flow``: every family of :data:`FAMILIES` at initialisation; adds
    their curves to ``curves`` and draws gradient_flow.png."""
    results = phases.results
    n, steps, batch, m = opts.flow_hidden, opts.flow_steps, 4, 32
    with phases(
        "gradient_flow",
        f"{len(FAMILIES)} cell families at initialisation, {n} units, {steps} steps",
        unit="cells",
    ) as track:
        xs = cells.base.flat_draw(
            jax.random.normal, jax.random.PRNGKey(opts.seed), (steps, batch, m)
        )
        norms = results["gradient_norms_at_init"] = {}
        for label, (name, settings) in track(FAMILIES.items(), total=len(FAMILIES)):
            cell = cells.make(name, n, **settings)
            params = cell.init(jax.random.PRNGKey(opts.seed + 1), m)
            curve = flow.gradient_norms_through_time(cell, params, cell.initial_carry(batch), xs)
            curves[label], norms[label] = curve, curve.tolist()
            back = min(10, steps)
            tqdm.write(
                f"{label:>16}: gradient norm {curve[back]:.2e} at {back} steps back, "
                f"{curve[-1]:.2e} at {steps}"
            )
        phases.wrote(plots.plot_gradient_flow(curves, out / "gradient_flow.png", title=title))


def _run_flow(
    workdir: pathlib.Path,
    out: pathlib.Path,
    opts: AnalysisOptions,
    phases: Phases,
    curves: dict,
    title: str,
    redraw: bool = False,
) -> None:
    """Phase ``run_flow``: the run's cell at initialisation and trained; adds its curves
    to ``curves`` and redraws gradient_flow.png, draws gersgorin.png. Kept from an
    earlier analysis (:meth:`Phases.kept`), its curves are added from there, and
    gradient_flow.png redrawn with them if ``redraw`` (the families' curves are new)."""
    steps, tokens = opts.flow_steps, opts.flow_tokens
    config = workdir_lib.read_config(workdir)
    if phases.kept(
        "run_flow",
        _settings(opts, "flow_steps", "flow_tokens", "split", data_dir=_data_dir(config, opts)),
    ):
        run = phases.results["run"]
        for name in ("initialisation", "trained"):
            curves[f"{run['label']}, {name} ({opts.split})"] = np.asarray(
                run[name]["gradient_norms"]
            )
        if redraw:
            drawn = plots.plot_gradient_flow(curves, out / "gradient_flow.png", title=title)
            print(f"wrote {drawn}")
        return
    with phases(
        "run_flow",
        f"the run's cell at initialisation and trained: gradient flow over "
        f"{steps} steps, Jacobians along {tokens + 1} tokens of {opts.split}",
        unit="parameter sets",
    ) as track:
        label, cell, init, trained, xs_trained, xs_init = run_cell(
            workdir, opts, max(tokens, steps) + 1
        )
        _note_checkpoint(workdir, phases.results)
        run = phases.results["run"] = {"workdir": str(workdir), "label": label}
        panels = []
        sets = (("initialisation", init, xs_init), ("trained", trained, xs_trained))
        for name, cell_params, seq in track(sets, total=len(sets)):
            curve, panel, run[name] = _cell_flow(cell, cell_params, seq, steps, tokens)
            curves[f"{label}, {name} ({opts.split})"] = curve
            panels.append({"title": f"{label}, {name}: after {tokens} steps", **panel})
            rho = np.asarray(run[name]["spectral_radius"])
            tqdm.write(
                f"{label}, {name}: spectral radius along {len(rho)} steps: mean "
                f"{rho.mean():.3f}, max {rho.max():.3f}; mean disc radius "
                f"{run[name]['disc_radius_mean']:.3f}"
            )
        gersgorin = "Gersgorin discs of the temporal Jacobian"
        phases.wrote(plots.plot_gersgorin(panels, out / "gersgorin.png", title=gersgorin))
        phases.wrote(plots.plot_gradient_flow(curves, out / "gradient_flow.png", title=title))


def _cell_flow(cell, params, seq, steps: int, tokens: int):
    """``(curve, panel, numbers)`` of a cell reading ``seq [T, 1, m]`` from its initial
    carry: the gradient norms over ``steps`` steps ``[steps + 1]``; the Gersgorin discs
    and eigenvalues of the Jacobian after ``tokens`` steps; its spectral radius and
    largest singular value at every step, the mean disc radius and centre, the curve."""
    carry = cell.initial_carry(1)
    curve = flow.gradient_norms_through_time(cell, params, carry, seq[:steps])
    a = flow.jacobians_along(cell, params, carry, seq[: tokens + 1])[:, 0]
    last = np.asarray(a[-1])
    centres, radii = flow.gersgorin_discs(last)
    numbers = {
        "spectral_radius": flow.spectral_radius(a).tolist(),
        "largest_singular_value": flow.largest_singular_value(a).tolist(),
        "disc_radius_mean": float(radii.mean()),
        "disc_centre_mean": float(centres.mean()),
        "gradient_norms": curve.tolist(),
    }
    panel = {"centres": centres, "radii": radii, "eigenvalues": flow.eigenvalues(last)}
    return curve, panel, numbers


# ------------------------------------------------------------------ the analyses


def analyze(workdir: pathlib.Path, out: pathlib.Path, opts: AnalysisOptions) -> dict:
    """The analysis of the run's kind (see the module docstring) as :class:`Phases`, whose
    numbers go to ``out/analysis.json`` (and ``flow.json`` for a sequence classifier),
    rewritten after every phase; prints and records (``'checkpoint'``) which checkpoint
    it reads. Returns the numbers.

    Raises:
      ValueError: (one line) no config.json, no checkpoint, data that do not fit the run.
      Interrupted: on a signal, after writing the phases done (see the module docstring).
    """
    kind = run_kind(workdir_lib.read_config(workdir))
    out.mkdir(parents=True, exist_ok=True)
    extra = [out / "flow.json"] if kind == "sequences" else []
    phases = Phases([out / "analysis.json", *extra], opts)
    phases.resume(checkpoint_used(workdir))
    _note_checkpoint(workdir, phases.results)
    if kind == "lm":
        analyze_lm(workdir, out, opts, phases)
    elif kind == "images":
        analyze_highway(workdir, out, opts, phases=phases)
    else:
        print("a sequence classifier: its analysis is the information flow of its cell")
        flow_figures(workdir, out, opts, phases)
    results = phases.finish()
    print(f"wrote {out / 'analysis.json'}")
    return results


def analyze_highway(
    workdir: pathlib.Path,
    out: pathlib.Path,
    opts: AnalysisOptions,
    train_split=None,
    phases: Phases | None = None,
) -> dict:
    """Gate heatmap and lesions of a feed-forward highway run (plain nets: lesions only,
    a removed plain layer passing its input through unchanged, as a removed highway
    layer does; :func:`rhnzoo.analysis.highway.iter_highway_lesions`), on the run's
    training images (``train_split``: ``(images, labels)`` already loaded).

    Phases ``gate_heatmaps`` (highway nets) and ``lesion`` (bars over batches);
    ``phases``: the analysis' (None: new ones that write no file). Returns the numbers.
    """
    from rhnzoo.analysis import highway as hw_analysis

    phases = phases or Phases([], opts)
    net, params, config = hw_analysis.load_highway_run(workdir)
    if train_split is None:
        images = data.load(
            config["dataset"], _data_dir(config, opts), download=False, verify=opts.verify
        )
        train_split = evaluation.split_data(
            images.train_images,
            images.train_labels,
            images.test_images,
            images.test_labels,
            int(config.get("valid_size", 10000)),
        )["train"]
    x, y = train_split
    results = phases.results
    results.update(workdir=str(workdir), model=f"{net.kind} depth {net.depth}")
    data_dir = _data_dir(config, opts)
    if net.kind == "highway" and not phases.kept(
        "gate_heatmaps", _settings(opts, "heatmap_examples", data_dir=data_dir)
    ):
        shown = x[: opts.heatmap_examples]
        with phases(
            "gate_heatmaps", f"transform gates over {len(shown):,} training images", unit="batches"
        ) as track:
            gates = hw_analysis.gate_statistics(net, params, shown, track=track)
            phases.wrote(
                plots.plot_highway_gates({f"depth {net.depth}": gates}, out / "gate_heatmaps.png")
            )
    n = opts.lesion_examples
    if phases.kept("lesion", _settings(opts, "lesion_examples", data_dir=data_dir)):
        return results
    with phases(
        "lesion",
        f"the intact net and {net.depth - 1} removed {net.kind} layers, "
        f"{len(x[:n]):,} training images each",
        unit="batches",
    ) as track:
        for lesion in hw_analysis.iter_highway_lesions(net, params, (x[:n], y[:n]), track=track):
            results["lesion"] = {
                "intact_nll": lesion.base_nll,
                "nll": lesion.nll.tolist(),
                "num_images": lesion.num_tokens,
                "num_layers": net.depth - 1,
            }
        print(
            f"lesions: intact {lesion.base_nll:.4f} nats, removed layers "
            f"{lesion.nll.min():.4f} .. {lesion.nll.max():.4f}"
        )
        phases.wrote(plots.plot_lesion_curve({f"depth {net.depth}": lesion}, out / "lesion.png"))
    return results


def analyze_lm(
    workdir: pathlib.Path, out: pathlib.Path, opts: AnalysisOptions, phases: Phases | None = None
) -> dict:
    """Gates, lesions (RHN cells), HSG gates (HSG(RHN)) and MC dropout (any cell).

    Phases ``gate_heatmap``, ``lesion``, ``hsg_gate`` (RHN cells; the last for HSG),
    ``deterministic`` and ``mc_dropout`` (with ``opts.mc_samples``); ``phases``: the
    analysis' (None: new ones that write no file). Returns the numbers.
    """
    phases = phases or Phases([], opts)
    model, params, config = lm_analysis.load_run(workdir)
    dataset = config.get("dataset", "ptb")
    corpus = data.load(dataset, _data_dir(config, opts), download=False, verify=opts.verify)
    if corpus.vocab_size != model.vocab_size:
        raise ValueError(
            f"the run has a {model.vocab_size}-symbol vocabulary but the data has "
            f"{corpus.vocab_size}; pass the run's --data_dir"
        )
    stream = getattr(corpus, opts.split)
    if opts.max_eval_tokens is not None:
        stream = stream[: opts.max_eval_tokens]
    label = lm_analysis.run_label(config)
    results = phases.results
    results.update(workdir=str(workdir), model=label, dataset=dataset, split=opts.split)
    print(f"{label} on {dataset}: {sum(p.size for p in jax.tree.leaves(params))} parameters")
    run = (model, params, label, out, opts, phases)
    data_dir = _data_dir(config, opts)
    # The options each phase's numbers depend on (Phases.kept).
    on_split = ("split", "max_eval_tokens", "eval_num_steps")
    uses = {
        "gate_heatmap": ("split", "max_eval_tokens", "heatmap_steps"),
        "lesion": ("lesion_tokens", "lesion_batch_size", "eval_num_steps"),
        "hsg_gate": (*on_split, "hist_tokens", "hist_times", "seed"),
        "deterministic": (*on_split, "mc_batch_size"),
        "mc_dropout": (*on_split, "mc_batch_size", "mc_samples", "seed"),
    }
    todo = lambda name: not phases.kept(name, _settings(opts, *uses[name], data_dir=data_dir))
    if _is_rhn(model.cell):
        if todo("gate_heatmap"):
            _gate_heatmap(*run, corpus, stream)
        if todo("lesion"):
            _lesions(*run, corpus.train[: opts.lesion_tokens])
        if isinstance(model.cell, cells.HSG) and todo("hsg_gate"):
            _hsg_gates(*run, stream[: opts.hist_tokens])
    else:
        print(
            f"{label}: no transform gates (gate heatmap, lesions and HSG gates are for RHN cells)"
        )
    if opts.mc_samples:
        if todo("deterministic"):
            _deterministic(*run, stream)
        if todo("mc_dropout"):
            _mc_dropout(*run, stream, config)
    return results


def _gate_heatmap(model, params, label, out, opts, phases, corpus, stream) -> None:
    """Phase ``gate_heatmap``: transform gates over an example sequence (Zilly et al. Fig. 5b)."""
    example = stream[: opts.heatmap_steps]
    with phases(
        "gate_heatmap", f"transform gates over the first {len(example)} tokens of {opts.split}"
    ):
        gates = lm_analysis.gate_activity(model, params, example[None])
        layer_mean = gates.t.mean(axis=(0, 2, 3))
        phases.results["t_gate_mean_per_layer"] = [float(v) for v in layer_mean]
        print("mean T gate per micro-layer:", " ".join(f"{v:.3f}" for v in layer_mean))
        phases.wrote(
            plots.plot_gate_heatmap(
                gates.t,
                out / "gate_heatmap.png",
                labels=[corpus.vocab[i] for i in example],
                title=f"{label}: mean T-gate activity ({opts.split}, first {len(example)} tokens)",
            )
        )


def _lesions(model, params, label, out, opts, phases, tokens) -> None:
    """Phase ``lesion`` (Zilly et al. sec. 6): ``results['lesion']`` holds the finished
    evaluations as they come (``nll``/``ppl`` of the layers lesioned so far)."""
    depth = (model.cell.cell if isinstance(model.cell, cells.HSG) else model.cell).depth
    with phases(
        "lesion",
        f"the intact model and {depth} lesioned micro-layers, {len(tokens):,} "
        f"training tokens each (batch {opts.lesion_batch_size}, windows of "
        f"{opts.eval_num_steps})",
        unit="windows",
    ) as track:
        lesions = lm_analysis.iter_lesions(
            model,
            params,
            tokens,
            batch_size=opts.lesion_batch_size,
            num_steps=opts.eval_num_steps,
            track=track,
        )
        for lesion in lesions:
            phases.results["lesion"] = {
                "num_tokens": lesion.num_tokens,
                "intact_nll": lesion.base_nll,
                "intact_ppl": lesion.base_ppl,
                "nll": lesion.nll.tolist(),
                "ppl": lesion.ppl.tolist(),
                "num_layers": depth,
            }
        print(
            f"lesions on {lesion.num_tokens} training tokens: intact {lesion.base_nll:.4f} "
            f"nats/token, perplexity {lesion.base_ppl:.2f}"
        )
        for layer, (nll, ppl, d) in enumerate(zip(lesion.nll, lesion.ppl, lesion.delta_nll)):
            print(
                f"  lesion micro-layer {layer + 1}: {nll:.4f} nats/token (Δ {d:+.4f}), "
                f"perplexity {ppl:.2f} (Δ {ppl - lesion.base_ppl:+.2f})"
            )
        title = f"{label}: lesioning (intact ppl {lesion.base_ppl:.1f})"
        phases.wrote(plots.plot_lesion(lesion, out / "lesion.png", title=title))


def _hsg_gates(model, params, label, out, opts, phases, tokens) -> None:
    """Phase ``hsg_gate``: HSG gate histogram (Shoham & Permuter Fig. 7)."""
    times = min(opts.hist_times, len(tokens))
    with phases(
        "hsg_gate",
        f"HSG gates at {times} random steps of the first {len(tokens):,} tokens of {opts.split}",
        unit="windows",
    ) as track:
        values = lm_analysis.hsg_gate_sample(
            model,
            params,
            tokens[None],
            times,
            seed=opts.seed,
            num_steps=opts.eval_num_steps,
            track=track,
        )
        below, above = float((values < 0.1).mean()), float((values > 0.9).mean())
        phases.results["hsg_gate"] = {
            "num_values": int(values.size),
            "mean": float(values.mean()),
            "fraction_below_0.1": below,
            "fraction_above_0.9": above,
        }
        title = f"{label}: HSG gate values ({opts.split})"
        print(
            f"HSG gate over {values.size} values: mean {values.mean():.3f}, "
            f"< 0.1: {below:.1%}, > 0.9: {above:.1%}"
        )
        phases.wrote(plots.plot_gate_histogram(values, out / "hsg_gates.png", title=title))


def _deterministic(model, params, label, out, opts, phases, stream) -> None:
    """Phase ``deterministic``: the batch-``mc_batch_size`` perplexity without dropout."""
    del label, out
    batch = opts.mc_batch_size
    with phases(
        "deterministic",
        f"{opts.split} perplexity without dropout, {len(stream):,} tokens at batch {batch}",
        unit="windows",
    ) as track:
        t0 = time.perf_counter()
        nll, count = lm_analysis.stream_nll(
            model, params, stream, batch, opts.eval_num_steps, track
        )
        seconds = time.perf_counter() - t0
        ppl = evaluation.METRICS["ppl"](nll / count)
        phases.results["deterministic"] = {"ppl": ppl, "seconds": seconds}
        print(
            f"{opts.split} perplexity, batch {batch}, {int(count)} tokens: deterministic "
            f"{ppl:.3f} ({seconds:.1f} s incl. compile)"
        )


def _mc_dropout(model, params, label, out, opts, phases, stream, config) -> None:
    """Phase ``mc_dropout``: MC-dropout perplexity (the reference code's ``evaluate_mc``);
    its numbers only when all K passes are done."""
    del label, out
    rates = dropout.Rates(*(float(config.get(f"drop_{s}", 0.0)) for s in "xiho"))
    k, batch = opts.mc_samples, opts.mc_batch_size
    with phases(
        "mc_dropout",
        f"{k} passes with dropout over {len(stream):,} tokens of {opts.split} at batch {batch}",
        unit="windows",
    ) as track:
        mc = lm_analysis.mc_dropout_perplexity(
            model,
            params,
            stream,
            rates,
            k,
            seed=opts.seed,
            batch_size=batch,
            num_steps=opts.eval_num_steps,
            track=track,
        )
        phases.results["mc_dropout"] = {
            "samples": k,
            "rates": [rates.x, rates.i, rates.h, rates.o],
            "ppl": mc.perplexity,
            "sample_ppls": list(mc.sample_perplexities),
            "num_tokens": mc.num_tokens,
            "compile_s": mc.compile_s,
            "pass_s": list(mc.pass_s),
            "seconds": mc.seconds,
        }
        per_pass = sum(mc.pass_s) / len(mc.pass_s)
        print(
            f"{opts.split} perplexity, batch {batch}, {mc.num_tokens} tokens: MC dropout "
            f"K={k} {mc.perplexity:.3f} ({mc.seconds:.1f} s: compile {mc.compile_s:.1f} s + "
            f"{per_pass:.1f} s per pass)"
        )
        print("  single-pass perplexities:", " ".join(f"{p:.2f}" for p in mc.sample_perplexities))
