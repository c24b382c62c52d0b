"""``prepare`` (here): a window's stage (``.harvest/``, a CPU chunk's ``.harvest_cpu/``) and
the device call that runs it."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import shutil
import subprocess

from tools.harvest.chunks import (
    CPU_LIMIT_S,
    ROOT,
    SMOKE_RECORDS,
    TIMEOUT_S,
    Chunk,
    HarvestError,
    check_size,
    chunk_of,
    git,
    next_pending,
    records_dir,
    stage_name,
)
from tools.harvest.device import experiment_command

TRAVEL_LIMIT = 64 * 2**20  # tracked and untracked-not-ignored files + carried paths
COMMAND_LIMIT = 2000  # characters of one device command


def device_command(name: str, smoke: bool = False) -> str:
    """The one command the device runs for window ``name`` (from the repository root,
    ``$OUT`` set by the device tool)."""
    return f"PYTHONPATH=$PWD python -m tools.harvest run {name}" + (" --smoke" if smoke else "")


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
    tracked and untracked-not-ignored files. ``.git`` stays behind (the device tool's
    limit counts the working tree, and a clone's ``.git`` is 6-16 MB by how it was made)."""
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
    return total


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
    (:func:`~tools.harvest.chunks.check_size`) is refused.

    It carries the window's data sets (from ``$RHNZOO_DATA``, else ``../shared/data``),
    the Word2Vec vectors it reads (made here first, unless ``smoke``: random embeddings)
    and the partial archive of an earlier cut window of it (``records/<table>/partial/``;
    ``records``: the chunk's (:func:`~tools.harvest.chunks.records_dir`), with ``smoke``
    :data:`~tools.harvest.chunks.SMOKE_RECORDS`). Everything is checked before
    ``.harvest/`` is touched: a missing data set, vectors that cannot be made, or more
    than :data:`TRAVEL_LIMIT` bytes travelling (``tree``'s tracked and
    untracked-not-ignored files and the carried folder) raise HarvestError and leave it
    as it was."""
    name = name or next_pending(queue, on)
    chunk, minutes = chunk_of(name, queue), check_size(name, queue)
    if records is None:
        records = SMOKE_RECORDS if smoke else records_dir(chunk)
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
        commit = git(tree, "rev-parse", "--short", "HEAD")
        dirty = git(tree, "status", "--porcelain", "--untracked-files=no")
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
