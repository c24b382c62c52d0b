"""The GPU harvest (issues 47, 57): the papers' tables at their own sizes, filled window by
window in a GPU's short device calls.

A window is one queue row (a chunk of one table): one device command that runs in at most
9 minutes from a fresh checkout where rhnzoo is importable only through ``PYTHONPATH``
and the image lacks gensim, tensorflow-datasets, tensorboardX and a network. What it
reads travels in ``.harvest/`` (an ignored folder, carried beside the working tree);
it trains outside ``$OUT`` (in ``.harvest/work/``) and leaves in ``$OUT`` at most three
files: ``<window>.tar.gz`` (the run records: ``config.json``, ``metrics.jsonl``,
``results.json``, the logs; ``harvest.json``, ``log.txt``), ``<window>.partial.tar.gz``
(a window cut at its deadline: its whole work folder with the checkpoints, where that
fits in :data:`PARTIAL_LIMIT`) and ``summary.json``. The queue is
``docs/runs/gpu/queue.tsv`` (a record, updated by ``record``, so it stays beside the
records in ``docs/runs/gpu/``, not in the package)::

  python -m rhnzoo.studies.harvest list                     # the queue
  python -m rhnzoo.studies.harvest prepare [WINDOW] [--smoke]  # here: .harvest/, the call
  PYTHONPATH=$PWD python -m rhnzoo.studies.harvest run [WINDOW] [--smoke]  # the device
  python -m rhnzoo.studies.harvest record [--smoke] OUT_DIR  # here: the records, the table
  python -m rhnzoo.studies.harvest table TABLE              # the table of what is recorded

With no WINDOW, ``prepare`` takes the next pending GPU row (``--cpu``: CPU chunk) and
``run`` the prepared one. The GPU windows hold Table 3 (RRL), each sized under the
deadline (``check_size``; ``record`` re-sizes the rest from a window's wall time); the
highway report and the JSB study are CPU chunks, one core, at most 45 min each, run here
in the background from ``.harvest_cpu/`` (docs/runs/gpu/README.md: sizes, evidence).
``prepare`` makes what the window reads that can be made here (the IMDB 256-d Word2Vec
vectors, gensim's fixed seed), carries back a ``partial`` archive of an earlier window
(``run`` resumes it), checks everything before it touches ``.harvest/`` and prints the
whole device call (command, carry list, ``timeout_s``) as its last line, JSON.
``record`` reads ``OUT_DIR`` without writing there (a device's files come back
read-only), unpacks into a temporary folder and merges the records into
``docs/runs/gpu/harvest/<table>/``; a ``--smoke`` archive goes only to ``--records``
(default ``runs/harvest_smoke/``), never into a paper table or the queue.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
GPU_RECORDS = ROOT / "docs" / "runs" / "gpu"
QUEUE = GPU_RECORDS / "queue.tsv"
RECORDS = GPU_RECORDS / "harvest"  # <table>/<run>/{config.json, ...}; <table>/partial/
SMOKE_RECORDS = ROOT / "runs" / "harvest_smoke"  # --smoke records: never a paper table
STAGE_NAME = ".harvest"  # what a device call carries: data/, cache/, resume/, window.json
CPU_STAGE_NAME = ".harvest_cpu"  # a CPU chunk's, beside it
TRAVEL_LIMIT = 64 * 2**20  # tracked files + .git + carried paths
OUT_FILES, OUT_FILE_LIMIT, OUT_LIMIT, OUT_DEPTH = 8, 16 * 2**20, 64 * 2**20, 2
PARTIAL_LIMIT = 16 * 2**20  # a cut window's work folder, compressed, if it is to come back
COMMAND_LIMIT = 2000  # characters of one device command
TIMEOUT_S = 600  # one device command
DEADLINE_S = 9 * 60 - 40  # the experiment's share of a window (archives after)
GRACE_S = 30  # from SIGTERM (the runs save) to SIGKILL
KEPT = ("config.json", "metrics.jsonl", "results.json", "sweep.log", "table.md", "log.txt")
QUEUE_HEADER = ("chunk", "on", "estimate", "state", "date", "device", "commit", "minutes", "note")


class HarvestError(Exception):
    """Bad input or a window that cannot be prepared or recorded (one line)."""


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One window's work: ``script`` with ``flags`` into ``RECORDS/<table>``, on a GPU
    (a device call) or on this CPU (a background job), sized before it is queued."""

    name: str
    table: str  # the records' folder, shared by the chunks of one table
    script: str
    flags: tuple[str, ...]
    data: tuple[str, ...]  # data sets (folders of $RHNZOO_DATA) it reads
    vectors: str | None = None  # the RRL data set whose Word2Vec vectors it reads
    minutes: float = 8.0  # its size: the estimate (evidence: docs/runs/gpu/README.md)
    smoke: tuple[str, ...] = ()  # flags over ``flags`` for --smoke (a CPU's scale)
    metric: str = "test_acc"  # the table's column (results.json key)
    select: str | None = None  # a random search's selection key: the best is its best's metric
    stack: bool = False  # a row's --seeds=K as one vmapped program (--stack_seeds)
    device: str = "gpu"  # "gpu": a device window; "cpu": a background job on one core
    run_dir: str | None = None  # a one-run script's --workdir under runs/ (its run's name)


# A window's experiment gets DEADLINE_S (the rest of the command archives); a CPU chunk
# CPU_LIMIT_S on one core (issue 57: a session's background job, recorded before it ends).
CPU_LIMIT_S = 45 * 60


def stage_name(chunk: Chunk) -> str:
    """The folder (in the checkout's root) ``chunk`` is staged in and trains in."""
    return STAGE_NAME if chunk.device == "gpu" else CPU_STAGE_NAME


def limit_s(chunk: Chunk) -> float:
    """The seconds ``chunk``'s experiment may take: :data:`DEADLINE_S` on a GPU,
    :data:`CPU_LIMIT_S` on the CPU."""
    return DEADLINE_S if chunk.device == "gpu" else CPU_LIMIT_S


# Table 3 at the paper's sizes (docs/rrl.md): IMDB with its 256-d word2vec vectors (made by
# prepare and carried: the GPU image has no gensim) and skip L 50, --divergence_factor=0 as
# in the one-seed table (the check stops six of seven models on a start-up transient at
# this size); P-MNIST 10 epochs, skip L 10. Each model's 3 seeds are one stacked program,
# the models of a window one after another (--jobs=3 unstacked is 1 stacked: side-by-side
# processes time-slice one GPU, seven IMDB processes took the sum of their single times,
# af9c2e7), so a window cut at its deadline keeps the models it finished. Sizes
# (docs/runs/gpu/README.md, "Window sizes"): IMDB, a one-seed run's GPU time is 11 min / 7
# = 94 s (the seven one-seed runs side by side, H100, af9c2e7), three seeds stacked
# assumed 1.5x one seed's (unmeasured on a GPU: the first window measures it) = 141 s a
# model; P-MNIST, 15,940 steps (10 epochs of 1,594 at batch 32) x the B 100 step (the
# stacked B 3 x 32; H100 u8: LSTM 13.3, GRU 14.7, RRN 16.0, SC-LSTM-P 18.7 ms; the
# unmeasured SC-LSTM-I, HRL, LSTM+GRU taken as SC-LSTM-P's) + 60 s compile and evaluation.
RRL_MODELS = ("lstm", "gru", "rrn", "sc_lstm_i", "sc_lstm_p", "hrl", "lstm_gru")
IMDB_WINDOWS = {
    "w1": ("lstm", "gru", "rrn"),
    "w2": ("sc_lstm_i", "sc_lstm_p"),
    "w3": ("hrl", "lstm_gru"),
}
IMDB_MODEL_S = 94 * 1.5
PMNIST_STEPS = 15_940
PMNIST_STEP_MS = {"lstm": 13.3, "gru": 14.7, "rrn": 16.0}  # others: SC-LSTM-P's 18.7
PMNIST_OVERHEAD_S = 60
# Smoke: 2 steps of 64 sequences, dev and test 160 each (the full 9,000 + 10,000 P-MNIST
# or 3,750 + 25,000 IMDB sequences were most of a smoke window's CPU time), and a long
# schedule (--epochs) so that --smoke_steps, not the epochs, ends a longer run.
RRL_SMOKE = (
    "--max_steps=2",
    "--subset=64",
    "--eval_subset=160",
    "--epochs=1000",
    "--hidden_size=8",
    "--embed_size=8",
    "--hybrid_hidden_size=8",
    "--embeddings=random",
    "--batch_size=16",
    "--jobs=1",
)


def _rrl(dataset: str, name: str, models: tuple[str, ...], extra: tuple[str, ...], **kw) -> Chunk:
    return Chunk(
        name=f"rrl-{dataset}-{name}",
        table=f"rrl_{dataset}_paper",
        script="experiments/rrl.py",
        flags=(
            f"--dataset={dataset}",
            "--preset=paper",
            "--table",
            f"--models={','.join(models)}",
            "--seeds=3",
            "--jobs=3",
            "--noprogress",
            *extra,
        ),
        smoke=RRL_SMOKE,
        stack=True,
        **kw,
    )


# The highway report's setting (docs/highway.md) on this CPU: MNIST, 400 epochs (156,000
# steps), one net (kind, depth) and one seed per chunk, in the sweep's run folder
# (<kind>_d<depth>, _s<k> for seed k > 0). Sizes from the train step measured on one quiet
# core (rhnzoo.bench.seeds, docs/runs/seeds/cpu1_highway_9d33f12.jsonl: plain 1.16 / 8.10
# ms, highway 1.21 / 9.57 ms at d10 / d100, taken linear in depth), x 156,000 steps, x
# HIGHWAY_LOADED: the two d10 chunks run beside other sessions' work (load about 11 on 2
# cores, d54cf8e) took 8.1 and 4.9 times their measured steps' time, 6.5 on average.
# Three seeds stacked in one step cost 2.95x (d10) to 5.7x (d100) one seed's step on
# this CPU, not less than 2x, so a chunk stays one seed (the same record).
HIGHWAY_DEPTHS = (10, 20, 50, 100)
HIGHWAY_SMOKE = ("--max_steps=2",)
HIGHWAY_STEP_MS = {"plain": (1.161, 8.097), "highway": (1.213, 9.568)}  # at d10, d100
HIGHWAY_LOADED = 6.5


def highway_minutes(kind: str, depth: int) -> float:
    """The estimated minutes of one 400-epoch highway-report run of ``kind`` and ``depth``
    on one loaded core of this CPU (see above)."""
    at10, at100 = HIGHWAY_STEP_MS[kind]
    step_ms = at10 + (at100 - at10) * (depth - 10) / 90
    return round(156_000 * step_ms / 1000 / 60 * HIGHWAY_LOADED, 1)


def _highway(kind: str, d: int, k: int) -> Chunk:
    return Chunk(
        name=f"highway-mnist-{kind}-d{d}-s{k}",
        table="highway_mnist_paper",
        script="experiments/highway.py",
        flags=(
            "--dataset=mnist",
            f"--kind={kind}",
            f"--depth={d}",
            "--epochs=400",
            f"--seed={k}",
            "--noanalyze",
            "--noprogress",
        ),
        data=("mnist",),
        minutes=highway_minutes(kind, d),
        smoke=HIGHWAY_SMOKE,
        device="cpu",
        run_dir=f"{kind}_d{d}" + (f"_s{k}" if k else ""),
    )


# Zilly et al. Fig. 4 (the JSB study) on this CPU: the full study's 20 trials x 40 epochs
# per (architecture, depth), one depth per chunk, trials one after another in one process.
# Sizes: a whole depth took 4-12 min with 2 cores (issue 57), so up to 24 min on one.
JSB_SMOKE = ("--trials=1", "--max_steps=2", "--width=8", "--jobs=1")
JSB_MINUTES = {1: 8.0, 2: 12.0, 4: 18.0, 6: 24.0}

CHUNKS: dict[str, Chunk] = {
    c.name: c
    for c in [
        *[
            _rrl(
                "imdb",
                w,
                models,
                ("--skip=50", "--divergence_factor=0"),
                data=("imdb",),
                vectors="imdb",
                minutes=round(len(models) * IMDB_MODEL_S / 60, 1),
            )
            for w, models in IMDB_WINDOWS.items()
        ],
        *[
            _rrl(
                "pmnist",
                m,
                (m,),
                ("--skip=10",),
                data=("mnist",),
                minutes=round(
                    (PMNIST_STEPS * PMNIST_STEP_MS.get(m, 18.7) / 1000 + PMNIST_OVERHEAD_S) / 60, 1
                ),
            )
            for m in RRL_MODELS
        ],
        # The highway runs' seed 0 at every depth, then the JSB study, then seeds 1 and 2.
        *[_highway(kind, d, 0) for d in HIGHWAY_DEPTHS for kind in ("plain", "highway")],
        *[
            Chunk(
                name=f"jsb-d{d}",
                table="jsb_paper",
                script="experiments/jsb.py",
                flags=(f"--depths={d}", "--jobs=1"),
                data=("jsb_chorales",),
                minutes=JSB_MINUTES[d],
                smoke=JSB_SMOKE,
                metric="test_nll",
                select="valid_nll",
                device="cpu",
            )
            for d in JSB_MINUTES
        ],
        *[
            _highway(kind, d, k)
            for k in (1, 2)
            for d in HIGHWAY_DEPTHS
            for kind in ("plain", "highway")
        ],
    ]
}


def chunk_of(name: str) -> Chunk:
    """The chunk (window) ``name``; HarvestError for an unknown one."""
    if name not in CHUNKS:
        raise HarvestError(f"no window {name!r}; `list` shows them")
    return CHUNKS[name]


# ----------------------------------------------------------------------------- the queue


def read_queue(queue: pathlib.Path | None = None) -> list[dict[str, str]]:
    """The queue's rows, one per chunk of :data:`CHUNKS` in its order (one missing there
    is pending): ``on`` (gpu / cpu, the chunk's), ``estimate`` (minutes: the chunk's
    size, or what ``record`` re-sized it to), then what ran (state, date, device, commit,
    minutes, note). Columns are read by the file's own header."""
    queue = QUEUE if queue is None else queue
    rows = {}
    if queue.is_file():
        lines = queue.read_text().splitlines()
        header = lines[0].split("\t") if lines else []
        for line in lines[1:]:
            fields = line.split("\t")
            rows[fields[0]] = {k: v for k, v in zip(header, fields) if k in QUEUE_HEADER}
    out = []
    for name, chunk in CHUNKS.items():
        row = dict.fromkeys(QUEUE_HEADER, "") | {"chunk": name, "state": "pending"}
        row |= rows.get(name, {})
        row["on"], row["estimate"] = chunk.device, row["estimate"] or f"{chunk.minutes:g}"
        out.append(row)
    return out


def write_queue(rows: list[dict[str, str]], queue: pathlib.Path | None = None) -> None:
    queue = QUEUE if queue is None else queue
    text = "\t".join(QUEUE_HEADER) + "\n"
    text += "".join("\t".join(r[k] for k in QUEUE_HEADER) + "\n" for r in rows)
    tmp = queue.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, queue)


def next_pending(queue: pathlib.Path | None = None, on: str = "gpu") -> str:
    """The first chunk ``on`` ``"gpu"`` (a device window) or ``"cpu"`` whose row is
    ``pending`` or ``partial`` (a partial one resumes)."""
    for row in read_queue(queue):
        if row["on"] == on and row["state"] in ("pending", "partial"):
            return row["chunk"]
    raise HarvestError(f"no {on} window is pending")


def check_size(name: str, queue: pathlib.Path | None = None) -> float:
    """The estimated minutes of window ``name`` (its queue row's: the chunk's size or
    ``record``'s re-size); HarvestError where a GPU window's exceeds its deadline
    (:func:`limit_s`): such a window would be cut every time, so it is refused, to be
    split into smaller chunks. A CPU chunk longer than its 45 min sitting is not refused:
    it is cut, kept in its partial archive, and resumes at its next sitting."""
    chunk = chunk_of(name)
    row = next(r for r in read_queue(queue) if r["chunk"] == name)
    minutes, limit = float(row["estimate"]), limit_s(chunk) / 60
    if minutes > limit and chunk.device == "gpu":
        raise HarvestError(
            f"{name}: estimated {minutes:g} min, more than the {limit:g} min a {chunk.device} "
            "chunk may take; split it (fewer models, depths or seeds a chunk)"
        )
    return minutes


# ------------------------------------------------------------------------- here: prepare


def device_command(name: str, smoke: bool = False) -> str:
    """The one command the device runs for window ``name`` (from the repository root,
    ``$OUT`` set by the device tool)."""
    return f"PYTHONPATH=$PWD python -m rhnzoo.studies.harvest run {name}" + (
        " --smoke" if smoke else ""
    )


def make_vectors(dataset: str, log=print) -> pathlib.Path:
    """The Word2Vec vectors an RRL window on ``dataset`` reads at the paper preset
    (:func:`rhnzoo.tasks.rrl.embeddings_for`, gensim's fixed seed), trained here into
    the user cache unless they are there; returns their file. HarvestError: no gensim,
    or the data set is missing."""
    from rhnzoo.configs import rrl as presets
    from rhnzoo.data import DataError, word2vec
    from rhnzoo.tasks import rrl

    config = presets.get_config("paper", dataset)
    try:
        data = rrl.load_data(config)
        path = word2vec.cache_path(
            data.train.inputs, data.vocab, config.embedding_size(), dataset=config.dataset
        )
        if not path.is_file():
            log(
                f"{dataset}: training the {config.embedding_size()}-d Word2Vec vectors "
                "(gensim, about 2 min on a CPU)"
            )
            rrl.embeddings_for(config, data, log=log)
    except DataError as e:
        raise HarvestError(f"{dataset} vectors: {e}") from None
    if not path.is_file():
        raise HarvestError(f"{dataset} vectors: {path} was not written")
    return path


def travelling_bytes(tree: pathlib.Path = ROOT) -> int:
    """What travels with every device call from ``tree`` besides the carried paths: its
    tracked and untracked-not-ignored files and its ``.git`` folder."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"],
            cwd=tree,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        raise HarvestError(f"{tree}: not a git checkout (the device call copies one)") from None
    total = 0
    for rel in filter(None, listed.decode().split("\0")):
        p = tree / rel
        if p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total + _bytes(tree / ".git")


def _bytes(path: pathlib.Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def prepare(
    name: str | None = None,
    smoke: bool = False,
    *,
    root: pathlib.Path = ROOT,
    records: pathlib.Path | None = None,
    tree: pathlib.Path = ROOT,
    queue: pathlib.Path | None = None,
    on: str = "gpu",
    log=print,
) -> dict:
    """Stages window ``name`` (None: the next pending ``on`` ``"gpu"`` or ``"cpu"``) into
    ``root/.harvest/`` (a CPU chunk: ``root/.harvest_cpu/``, so that a background job and
    a device window never share one) and returns (and prints, last, as JSON) its call
    ``{"command", "carry", "timeout_s"}``: the device's, or a CPU chunk's (run here as
    ``OUT=<folder> nice -n 19 <command>``). A window estimated past its limit
    (:func:`check_size`) is refused.

    It carries the window's data sets (from ``$RHNZOO_DATA``, else ``../shared/data``),
    the Word2Vec vectors it reads (made here first, unless ``smoke``: random embeddings)
    and the partial archive of an earlier cut window of it (``records/<table>/partial/``;
    ``records``: :data:`RECORDS`, with ``smoke`` :data:`SMOKE_RECORDS`). Everything is
    checked before ``.harvest/`` is touched: a missing data set, vectors that cannot be
    made, or more than :data:`TRAVEL_LIMIT` bytes travelling (``tree``'s tracked files,
    ``.git`` and the carried folder) raise HarvestError and leave it as it was."""
    name = name or next_pending(queue, on)
    chunk, minutes = chunk_of(name), check_size(name, queue)
    records = (SMOKE_RECORDS if smoke else RECORDS) if records is None else records
    carried, partial = _carried(chunk, smoke, records, log)
    size = sum(_bytes(src) for src, _ in carried)
    travelling = travelling_bytes(tree) + size
    if travelling > TRAVEL_LIMIT:
        raise HarvestError(
            f"{name}: {travelling / 2**20:.1f} MiB would travel (carried "
            f"{size / 2**20:.1f} MiB), more than {TRAVEL_LIMIT / 2**20:.0f} MiB"
        )
    command = device_command(name, smoke)
    if len(command) >= COMMAND_LIMIT:
        raise HarvestError(f"{name}: the device command has {len(command)} characters")
    stage = root / stage_name(chunk)
    new = root / (stage.name + ".new")
    shutil.rmtree(new, ignore_errors=True)
    try:
        for src, rel in carried:
            (new / rel).parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, new / rel)
        commit = _git(tree, "rev-parse", "--short", "HEAD")
        dirty = _git(tree, "status", "--porcelain", "--untracked-files=no")
        window = {
            "window": name,
            "smoke": smoke,
            "commit": commit + ("+" if dirty else ""),
            "prepared": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "resume": partial.is_file(),
        }
        (new / "window.json").write_text(json.dumps(window) + "\n")
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    shutil.rmtree(stage, ignore_errors=True)
    os.replace(new, stage)
    timeout = TIMEOUT_S if chunk.device == "gpu" else CPU_LIMIT_S + 5 * 60
    call = {"command": command, "carry": [stage.name], "timeout_s": timeout}
    how = " (resumes a partial window)" if partial.is_file() else ""
    log(
        f"{name} ({chunk.device}): carries {size / 2**20:.1f} MiB in {stage.name}/, "
        f"{travelling / 2**20:.1f} MiB travel in all; about {minutes:g} min{how}; it runs: "
        f"{' '.join(experiment_command(chunk, pathlib.Path(stage.name, 'work/runs'), smoke)[1:])}"
    )
    log(json.dumps(call))
    return call


def _carried(
    chunk: Chunk, smoke: bool, records: pathlib.Path, log
) -> tuple[list[tuple[pathlib.Path, str]], pathlib.Path]:
    """What ``chunk``'s stage carries, ``[(source, path in the stage)]`` (its data sets,
    its vectors made here unless ``smoke``, an earlier cut window's partial archive),
    and that archive's path (there or not). HarvestError: a data set is missing, or the
    vectors cannot be made."""
    data_root = pathlib.Path(os.environ.get("RHNZOO_DATA") or ROOT.parent / "shared" / "data")
    carried: list[tuple[pathlib.Path, str]] = []  # (source, path in the stage)
    for d in chunk.data:
        if not (data_root / d).is_dir():
            raise HarvestError(f"{chunk.name} reads {data_root / d}: not there (set RHNZOO_DATA)")
        carried.append((data_root / d, f"data/{d}"))
    if chunk.vectors and not smoke:
        from rhnzoo.data.common import user_cache_dir

        path = make_vectors(chunk.vectors, log=log)
        carried.append((path, f"cache/{path.relative_to(user_cache_dir('').parent)}"))
    partial = records / chunk.table / "partial" / f"{chunk.name}.tar.gz"
    if partial.is_file():
        carried.append((partial, f"resume/{chunk.name}.tar.gz"))
    return carried, partial


# ---------------------------------------------------------------------------- the device


def experiment_command(
    chunk: Chunk,
    workdir: pathlib.Path,
    smoke: bool,
    stack: bool | None = None,
    smoke_steps: int | None = None,
) -> list[str]:
    """The experiment's command line, its runs in ``workdir`` (a one-run chunk's in
    ``workdir/<run_dir>``); ``stack`` (default the chunk's): each row's
    ``--seeds=K`` as one program (``--stack_seeds``, ``--jobs`` divided by K);
    ``smoke_steps``: with ``smoke``, ``--max_steps`` instead of the smoke flags' 2."""
    stack = chunk.stack if stack is None else stack
    flags = [*chunk.flags, *(chunk.smoke if smoke else ())]
    if smoke and smoke_steps is not None:
        flags.append(f"--max_steps={smoke_steps}")
    seeds = int(_flag(flags, "--seeds") or 1)
    if stack and seeds > 1:
        flags = [*flags, "--stack_seeds", f"--jobs={max(1, int(_flag(flags, '--jobs')) // seeds)}"]
    if chunk.run_dir:  # a one-run script: its workdir is the run's folder
        workdir = workdir / chunk.run_dir
    return [sys.executable, chunk.script, *flags, f"--workdir={workdir}"]


def _flag(flags: list[str], name: str) -> str | None:
    """The last value of ``--name=value`` in ``flags`` (None if absent)."""
    values = [f.split("=", 1)[1] for f in flags if f.startswith(name + "=")]
    return values[-1] if values else None


def run(
    name: str | None = None,
    out: pathlib.Path | None = None,
    smoke: bool = False,
    deadline_s: float | None = None,
    *,
    root: pathlib.Path = ROOT,
    stack: bool | None = None,
    smoke_steps: int | None = None,
) -> dict:
    """Runs window ``name`` (None: the one prepared in ``root/.harvest/``) on the data
    and vectors the stage carries (else the environment's), resuming its carried
    partial archive; trains in ``root/.harvest/work/`` and stops the experiment at
    ``deadline_s`` (None: :func:`limit_s`; SIGTERM to its main process, which passes
    it on: the runs save).
    Writes into ``out`` only ``<window>.tar.gz``, ``<window>.partial.tar.gz`` (cut, and
    its work folder compressed fits :data:`PARTIAL_LIMIT`) and ``summary.json``;
    returns the summary. ``smoke_steps``: :func:`experiment_command`'s.
    HarvestError: ``deadline_s`` not finite and > 0 (NaN or inf waited for ever)."""
    _check_deadline(deadline_s)
    stage = root / (stage_name(chunk_of(name)) if name else STAGE_NAME)
    window = _read_json(stage / "window.json") or {}
    name = name or window.get("window")
    if not name:
        raise HarvestError(f"no window named and none prepared in {stage}")
    chunk = chunk_of(name)
    if out is None:
        raise HarvestError("no $OUT: name the folder the archives go to (--out)")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = stage / "work"
    if work.resolve().is_relative_to(out) or out.is_relative_to(work.resolve()):
        raise HarvestError(f"{out}: the work folder {work} may not be in it or hold it")
    runs = work / "runs"
    resumed = _work_folder(work, stage / "resume" / f"{name}.tar.gz", smoke)
    cmd = experiment_command(chunk, runs, smoke, stack, smoke_steps)
    start = time.time()
    deadline_s = limit_s(chunk) if deadline_s is None else deadline_s
    rc = _experiment(cmd, work / "log.txt", _environment(stage), deadline_s)
    finished = sorted(
        p.parent.relative_to(runs).as_posix()
        for p in runs.rglob("results.json")
        if "stacked" not in p.parts
    )
    minutes = round((time.time() - start) / 60, 2)
    before = (resumed or {}).get("minutes_total", (resumed or {}).get("minutes", 0.0))
    info = {
        "chunk": name,
        "table": chunk.table,
        "smoke": smoke,
        "returncode": rc,
        "minutes": minutes,
        "minutes_total": round(before + minutes, 2),
        "finished": finished,
        "complete": rc == 0,
        "resumed": resumed is not None,
        "command": cmd[1:],
        "date": datetime.date.today().isoformat(),
        "commit": window.get("commit") or _git(ROOT, "rev-parse", "--short", "HEAD") or "unknown",
        "device": _device(),
        "host": os.uname().nodename,
        "partial": None,
    }
    summary = dict(info, archives=_archives(name, work, out, info, stage))
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return summary


def _check_deadline(deadline_s: float | None) -> None:
    """HarvestError unless ``deadline_s`` is None or a finite number of seconds > 0: NaN
    passed ``<= 0`` and ``Popen.wait(timeout=nan)`` (or inf) waits for ever, which
    defeats the deadline that keeps a window's archives."""
    if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s > 0):
        raise HarvestError(f"--deadline_s={deadline_s:g}: must be a finite number > 0")


def _work_folder(work: pathlib.Path, carried: pathlib.Path, smoke: bool) -> dict | None:
    """A fresh ``work`` folder with an empty ``runs/``, or the ``carried`` partial
    archive unpacked in it (unless it was a smoke run and this is not, or back); returns
    the resumed archive's ``harvest.json`` (None: nothing resumed)."""
    shutil.rmtree(work, ignore_errors=True)
    runs = work / "runs"
    runs.mkdir(parents=True)
    if not carried.is_file():
        return None
    with tarfile.open(carried) as tar:
        tar.extractall(work, filter="data")
    resumed = _read_json(work / "harvest.json")
    if resumed is not None and resumed.get("smoke") != smoke:
        shutil.rmtree(work)  # a smoke partial never resumes a paper window, nor back
        runs.mkdir(parents=True)
        return None
    return resumed


def _environment(stage: pathlib.Path) -> dict[str, str]:
    """The experiment's environment: this checkout on ``PYTHONPATH``, the data and the
    cache the stage carries (if it does)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if (stage / "data").is_dir():
        env["RHNZOO_DATA"] = str(stage / "data")
    if (stage / "cache").is_dir():
        env["XDG_CACHE_HOME"] = str(stage / "cache")
    return env


def _experiment(cmd: list[str], log_path: pathlib.Path, env: dict, deadline_s: float) -> int:
    """Runs ``cmd`` (its lines appended to ``log_path``) and returns its exit status; at
    ``deadline_s`` seconds it gets SIGTERM, and SIGKILL (its process group) when it has
    not ended :data:`GRACE_S` seconds later."""
    with open(log_path, "a") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            # The main process alone: it passes the signal on to its children once (a
            # second SIGTERM would make them exit without saving).
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                return proc.wait()


def _archives(
    name: str, work: pathlib.Path, out: pathlib.Path, info: dict, stage: pathlib.Path
) -> list[str]:
    """Writes ``<name>.tar.gz`` (the work folder's records, no checkpoints) into ``out``
    and, for a window cut short, ``<name>.partial.tar.gz`` (its runs whole, to resume)
    when it fits :data:`PARTIAL_LIMIT` (``info['partial']`` says which); ``harvest.json``
    (``info``) in both. Returns the archives' names."""
    runs, archives = work / "runs", []
    with tempfile.TemporaryDirectory(dir=stage) as tmp:
        partial = pathlib.Path(tmp) / f"{name}.partial.tar.gz"
        if not info["complete"]:
            (work / "harvest.json").write_text(json.dumps(info, indent=1) + "\n")
            with tarfile.open(partial, "w:gz") as tar:
                for path in sorted(runs.rglob("*")):
                    if path.is_file():
                        tar.add(path, arcname=str(path.relative_to(work)))
                tar.add(work / "harvest.json", arcname="harvest.json")
            size = partial.stat().st_size
            info["partial"] = (
                f"{name}.partial.tar.gz"
                if size <= PARTIAL_LIMIT
                else f"not kept: {size / 2**20:.1f} MiB, more than {PARTIAL_LIMIT / 2**20:.0f} MiB"
            )
        (work / "harvest.json").write_text(json.dumps(info, indent=1) + "\n")
        archive = out / f"{name}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            for path in sorted(work.rglob("*")):
                rel = path.relative_to(work)
                kept = path.name in KEPT or rel.parent == pathlib.Path(".")
                state = {"checkpoints", "best", "stacked"} & set(rel.parts)
                if path.is_file() and kept and not state:
                    tar.add(path, arcname=f"{name}/{rel.as_posix()}")
        archives.append(archive.name)
        if info["partial"] == partial.name:
            shutil.move(partial, out / partial.name)
            archives.append(partial.name)
    return archives


def _read_json(path: pathlib.Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _git(tree: pathlib.Path, *args: str) -> str:
    """``git args``'s output in ``tree`` ('' where there is no git)."""
    try:
        return subprocess.run(
            ["git", *args], cwd=tree, text=True, capture_output=True, check=False
        ).stdout.strip()
    except OSError:
        return ""


def _device() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            text=True,
            capture_output=True,
            timeout=30,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    if out:
        return out.splitlines()[0]
    try:  # this CPU, named as docs/runs/cpu names it
        info = pathlib.Path("/proc/cpuinfo").read_text()
        model = next(x for x in info.splitlines() if x.startswith("model name"))
        return f"CPU: {model.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except (OSError, StopIteration):
        return "CPU"


def check_out(out: pathlib.Path) -> list[str]:
    """What in ``out`` breaks the device tool's limits on what comes back (at most
    :data:`OUT_FILES` plain files, each at most :data:`OUT_FILE_LIMIT` bytes,
    :data:`OUT_LIMIT` in all, no more than :data:`OUT_DEPTH` folders down): one line
    each; empty when everything comes back."""
    problems, files = [], [p for p in out.rglob("*") if not p.is_dir()]
    if len(files) > OUT_FILES:
        problems.append(f"{len(files)} files, more than {OUT_FILES}")
    for p in files:
        rel = p.relative_to(out)
        if p.is_symlink() or not p.is_file():
            problems.append(f"{rel}: not a plain file")
        elif p.stat().st_size > OUT_FILE_LIMIT:
            problems.append(f"{rel}: {p.stat().st_size / 2**20:.1f} MiB")
        if len(rel.parts) - 1 > OUT_DEPTH:
            problems.append(f"{rel}: more than {OUT_DEPTH} folders down")
    total = sum(p.stat().st_size for p in files if p.is_file())
    if total > OUT_LIMIT:
        problems.append(f"{total / 2**20:.1f} MiB in all")
    return problems


# --------------------------------------------------------------------------- here: record


def record(
    out_dir: pathlib.Path,
    smoke: bool = False,
    records: pathlib.Path | None = None,
    queue: pathlib.Path | None = None,
) -> dict[str, str]:
    """Merges every window archive in ``out_dir`` (read only: it is never written) into
    ``records/<table>/`` (``records``: :data:`RECORDS`; with ``smoke``
    :data:`SMOKE_RECORDS`): each run's folder replaced, the window's log and
    ``harvest.json`` beside them, a partial archive into ``partial/`` (a complete window
    removes its one); without ``smoke``, the window's queue row. Returns each table's
    text. HarvestError: no archive, or an archive whose ``smoke`` differs from ``smoke``
    (a smoke window never enters a paper table)."""
    records = (SMOKE_RECORDS if smoke else RECORDS) if records is None else records
    archives = sorted(p for p in out_dir.glob("*.tar.gz") if not p.name.endswith(".partial.tar.gz"))
    if not archives:
        raise HarvestError(f"{out_dir}: no window archive (<window>.tar.gz)")
    texts = {}
    with tempfile.TemporaryDirectory() as tmp:
        infos = []
        for archive in archives:
            unpacked = pathlib.Path(tmp) / archive.name.removesuffix(".tar.gz")
            try:
                with tarfile.open(archive) as tar:
                    tar.extractall(unpacked, filter="data")
            except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
                why = (str(e).strip().splitlines() or [""])[0]
                raise HarvestError(
                    f"{archive}: cut short or corrupt, not a readable .tar.gz "
                    f"({type(e).__name__}: {why})"
                ) from None
            work = next(unpacked.iterdir(), None) if unpacked.is_dir() else None
            info = _read_json(work / "harvest.json") if work is not None else None
            if not isinstance(info, dict) or info.get("chunk") not in CHUNKS:
                raise HarvestError(f"{archive}: not a window archive (no harvest.json)")
            if bool(info["smoke"]) != smoke:
                raise HarvestError(
                    f"{archive}: a {'--smoke' if info['smoke'] else 'paper-scale'} window; "
                    f"record it {'with' if info['smoke'] else 'without'} --smoke"
                )
            infos.append((archive, work, info))
        rows = read_queue(queue)
        for archive, work, info in infos:
            name = info["chunk"]
            dest = records / info["table"]
            dest.mkdir(parents=True, exist_ok=True)
            for results in sorted((work / "runs").rglob("results.json")):
                run_dir = results.parent
                target = dest / run_dir.relative_to(work / "runs")
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(run_dir, target)
            shutil.copyfile(work / "log.txt", dest / f"{name}.log")
            shutil.copyfile(work / "harvest.json", dest / f"{name}.json")
            partial = out_dir / f"{name}.partial.tar.gz"
            kept = dest / "partial" / f"{name}.tar.gz"
            if info["partial"] == partial.name and partial.is_file():
                kept.parent.mkdir(exist_ok=True)
                shutil.copyfile(partial, kept)
            elif info["complete"]:
                kept.unlink(missing_ok=True)
            _update_queue(rows, info, resumable=info["partial"] == partial.name)
            chunk = CHUNKS[name]
            texts[info["table"]] = table(dest, chunk.metric, chunk.select)
        if not smoke:
            write_queue(rows, queue)
    return texts


def _update_queue(rows: list[dict[str, str]], info: dict, resumable: bool) -> None:
    """Window ``info``'s queue row (done or partial: date, device, commit, minutes, a
    note), and for a GPU window the re-size of its table's pending GPU windows: each
    one's estimate is its chunk's size times this window's wall time over its chunk's
    size (for a cut window a lower bound), so that :func:`check_size` refuses one that
    would now pass the deadline."""
    name = info["chunk"]
    chunk = CHUNKS[name]
    ratio = info["minutes_total"] / chunk.minutes
    for row in rows:
        other = CHUNKS[row["chunk"]]
        if row["chunk"] == name:
            note = f"{len(info['finished'])} runs finished"
            if not info["complete"]:
                note += "; resumable" if resumable else f"; partial {info['partial']}"
            row.update(
                state="done" if info["complete"] else "partial",
                date=info["date"],
                device=info["device"],
                commit=info["commit"],
                minutes=str(info["minutes_total"]),
                note=note,
            )
        elif (chunk.device, other.device, other.table, row["state"]) == (
            "gpu",
            "gpu",
            chunk.table,
            "pending",
        ):
            least = "" if info["complete"] else " at least"
            row["estimate"] = f"{other.minutes * ratio:.1f}"
            row["note"] = f"estimate x{ratio:.2f}{least}: {name}'s wall time"


def table(dest: pathlib.Path, metric: str, select: str | None = None) -> str:
    """The table of ``dest``'s finished runs, written to ``dest/harvest_table.md``: per
    run name, its seeds (``<run>_s<k>``) or random-search trials (``<run>_t<k>``)
    together, the ``metric``'s mean ± sd (n) and best (accuracies in %), and where its
    runs ran (the windows' records beside them, ``<window>.json``: ``CPU`` or the GPU,
    with the commit); with ``select`` (lower is better), the best is the ``metric`` of
    the run with the best ``select``."""
    from rhnzoo.studies import tables

    ran = {}  # run -> "device (commit)", from the window records
    for window in sorted(dest.glob("*.json")):
        info = _read_json(window) or {}
        device = str(info.get("device", "?"))
        device = "CPU" if device.startswith("CPU") else device
        ran |= dict.fromkeys(info.get("finished", []), f"{device} ({info.get('commit', '?')})")
    groups: dict[str, list[dict]] = {}
    where: dict[str, set[str]] = {}
    for results in sorted(dest.rglob("results.json")):
        name = results.parent.relative_to(dest).as_posix()
        base, _, k = name.rpartition("_")
        base = base if k[:1] in ("s", "t") and k[1:].isdigit() else name
        r = json.loads(results.read_text())
        if r.get(metric) is not None:
            groups.setdefault(base, []).append(r)
            where.setdefault(base, set()).add(ran.get(name, "?"))
    acc = metric.endswith("_acc")
    scale = 100.0 if acc else 1.0

    def best(rs):
        if select is not None:
            return min(rs, key=lambda r: r.get(select, float("inf")))[metric]
        return (max if acc else min)(r[metric] for r in rs)

    rows = [
        (
            base,
            tables.mean_sd([r[metric] * scale for r in rs]),
            f"{best(rs) * scale:.2f}",
            ", ".join(sorted(where[base])),
        )
        for base, rs in groups.items()
    ]
    unit = " %" if acc else ""
    how = f" (at the best {select})" if select else ""
    head = ("run", f"{metric}{unit}, mean ± sd (n)", f"best{how}{unit}", "ran on (commit)")
    text = tables.markdown(head, rows)
    (dest / "harvest_table.md").write_text(text + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rhnzoo.studies.harvest", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("list", help="the queue")
    p = sub.add_parser("prepare", help="here: the window's .harvest/ and its device call")
    p.add_argument("window", nargs="?", help="a queue row (default: the next pending)")
    p.add_argument("--smoke", action="store_true", help="at a CPU's scale")
    p.add_argument("--cpu", action="store_true", help="the next pending CPU chunk")
    p = sub.add_parser("run", help="the device: the window, its archives into $OUT")
    p.add_argument("window", nargs="?", help="a queue row (default: the one prepared)")
    p.add_argument("--smoke", action="store_true", help="at a CPU's scale")
    p.add_argument("--out", default=os.environ.get("OUT"), help="default: $OUT")
    p.add_argument(
        "--deadline_s",
        type=float,
        default=None,
        help="SIGTERM to the experiment after this many seconds (the runs save; default "
        f"{DEADLINE_S} on a GPU, {CPU_LIMIT_S} for a CPU chunk)",
    )
    p.add_argument(
        "--smoke_steps",
        type=int,
        default=None,
        help="with --smoke: train this many steps (default the smoke flags' 2)",
    )
    p = sub.add_parser("record", help="here: OUT_DIR's archives into the records")
    p.add_argument("out_dir")
    p.add_argument("--smoke", action="store_true", help="smoke archives (never a paper table)")
    p.add_argument(
        "--records",
        default=None,
        help="default: docs/runs/gpu/harvest (--smoke: runs/harvest_smoke)",
    )
    p = sub.add_parser("table", help="the table of what is recorded")
    p.add_argument("table")
    args = parser.parse_args(argv)
    try:
        if getattr(args, "window", None) is not None:
            chunk_of(args.window)
        if args.what == "list":
            for row in read_queue():
                print("\t".join(row[k] for k in QUEUE_HEADER).rstrip())
        elif args.what == "prepare":
            prepare(args.window, args.smoke, on="cpu" if args.cpu else "gpu")
        elif args.what == "run":
            _check_deadline(args.deadline_s)
            if args.smoke_steps is not None and not (args.smoke and args.smoke_steps > 0):
                raise HarvestError("--smoke_steps: a positive number, with --smoke")
            run(
                args.window,
                pathlib.Path(args.out) if args.out else None,
                args.smoke,
                args.deadline_s,
                smoke_steps=args.smoke_steps,
            )
        elif args.what == "record":
            out_dir = pathlib.Path(args.out_dir)
            if not out_dir.is_dir():
                raise HarvestError(f"{out_dir}: not a folder")
            records = pathlib.Path(args.records) if args.records else None
            for text in record(out_dir, args.smoke, records).values():
                print(text)
        else:
            chunk = next((c for c in CHUNKS.values() if c.table == args.table), None)
            if chunk is None:
                raise HarvestError(f"no table {args.table!r}")
            print(table(RECORDS / args.table, chunk.metric, chunk.select))
    except HarvestError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
