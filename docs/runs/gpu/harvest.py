"""The GPU harvest (issue 47): the papers' tables at their own sizes, filled chunk by
chunk in a GPU's short windows.

A chunk is one prepared command: it runs in at most 9 minutes on one H100 from a fresh
checkout, reads only the data it carries (at most 64 MiB, copied into ``.harvest/``, an
ignored folder), and leaves one archive of its run records (``config.json``,
``metrics.jsonl``, ``results.json``, the run's log; no checkpoints) in ``$OUT``.
``queue.tsv`` beside this file lists every chunk with its state; whoever next has a GPU
runs the next pending one and commits its records::

  python docs/runs/gpu/harvest.py list                  # the queue
  python docs/runs/gpu/harvest.py prepare [CHUNK]       # here: its data into .harvest/;
                                                        # prints the device call
  python docs/runs/gpu/harvest.py run CHUNK             # on the GPU (device tool, carry
                                                        # .harvest): $OUT/CHUNK.tar.gz
  python docs/runs/gpu/harvest.py record ARCHIVE        # here: the records into
                                                        # docs/runs/gpu/harvest/<table>/,
                                                        # its queue row, the table
  python docs/runs/gpu/harvest.py table TABLE           # the table of what is recorded
  python docs/runs/gpu/harvest.py run CHUNK --smoke --out DIR   # the same at CPU scale
  python docs/runs/gpu/harvest.py run CHUNK --stack_seeds  # a row's seeds as one program

``run`` stops the experiment at the chunk's deadline (SIGTERM: the runs save and stop)
and archives the runs that finished; ``record`` marks the chunk ``done`` when every run
finished, else ``partial`` (its finished runs are kept; the chunk is split before it is
run again). Chunk sizes come from measured H100 times (docs/speed.md, docs/rrl.md); each
archive's ``harvest.json`` holds the chunk's wall time, so the next chunks are sized from
it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tarfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[3]
HERE = pathlib.Path(__file__).resolve().parent
QUEUE = HERE / "queue.tsv"
RECORDS = HERE / "harvest"  # <table>/<run>/{config.json, metrics.jsonl, results.json, ...}
STAGE = ROOT / ".harvest"  # what a device call carries: data/, cache/, commit.txt
CARRY_LIMIT = 64 * 2**20
DEADLINE_S = 9 * 60 - 40  # the experiment's share of a chunk's 9 minutes (archive after)
KEPT = ("config.json", "metrics.jsonl", "results.json", "sweep.log", "table.md")
QUEUE_HEADER = ("chunk", "state", "date", "device", "commit", "minutes", "note")


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One device call's work: ``script`` with ``flags`` into ``RECORDS/<table>``."""

    name: str
    table: str  # the records' folder, shared by the chunks of one table
    script: str
    flags: tuple[str, ...]
    data: tuple[str, ...]  # data sets (folders of $RHNZOO_DATA) it reads
    cache: tuple[str, ...] = ()  # user-cache files it reads (the word2vec vectors)
    minutes: float = 8.0  # the estimate it was sized by
    smoke: tuple[str, ...] = ()  # flags over ``flags`` for --smoke (a CPU's scale)
    metric: str = "test_acc"  # the table's column (results.json key)
    select: str | None = None  # a random search's selection key: the best is its best's metric


# Table 3 at the paper's sizes (docs/rrl.md): IMDB with its 256-d word2vec vectors (carried:
# the GPU image has no gensim) and skip L 50, --divergence_factor=0 as in the one-seed
# table (the check stops six of seven models on a start-up transient at this size);
# P-MNIST 10 epochs, skip L 10. One model, 3 seeds side by side per chunk: seven IMDB
# runs side by side took 6-11 min each on one H100 (af9c2e7); P-MNIST's step is 13 ms
# (5.4k steps a run).
RRL_MODELS = ("lstm", "gru", "rrn", "sc_lstm_i", "sc_lstm_p", "hrl", "lstm_gru")
W2V_IMDB_256 = "rhnzoo/imdb/word2vec/256d_a464f558328acc54.bin"
RRL_SMOKE = ("--max_steps=2", "--subset=64", "--hidden_size=8", "--embed_size=8",
             "--hybrid_hidden_size=8", "--embeddings=random", "--batch_size=16",
             "--jobs=1")  # fmt: skip


def _rrl(dataset: str, model: str, extra: tuple[str, ...], **kw) -> Chunk:
    return Chunk(
        name=f"rrl-{dataset}-{model}", table=f"rrl_{dataset}_paper", script="experiments/rrl.py",
        flags=(f"--dataset={dataset}", "--preset=paper", "--table", f"--models={model}",
               "--seeds=3", "--jobs=3", "--noprogress", *extra),
        smoke=RRL_SMOKE, **kw)  # fmt: skip


# The highway report's setting (docs/highway.md): MNIST, plain vs highway, 400 epochs, one
# depth (both kinds) per chunk, 3 seeds side by side: 6 runs of 172k steps.
HIGHWAY_SMOKE = ("--max_steps=2", "--seeds=1", "--jobs=1", "--noanalyze")

# Zilly et al. Fig. 4 (the JSB study): the full study's 20 trials x 40 epochs per
# (architecture, depth), one depth per chunk.
JSB_SMOKE = ("--trials=1", "--max_steps=2", "--width=8", "--jobs=1")

CHUNKS: dict[str, Chunk] = {c.name: c for c in [
    *[_rrl("imdb", m, ("--skip=50", "--divergence_factor=0"), data=("imdb",),
           cache=(W2V_IMDB_256,), minutes=7.0) for m in RRL_MODELS],
    *[_rrl("pmnist", m, ("--skip=10",), data=("mnist",), minutes=5.0) for m in RRL_MODELS],
    *[Chunk(name=f"highway-mnist-d{d}", table="highway_mnist_paper",
            script="experiments/highway.py",
            flags=("--dataset=mnist", "--sweep", f"--depths={d}", "--epochs=400", "--seeds=3",
                   "--jobs=6", "--noprogress"),
            data=("mnist",), minutes=8.0, smoke=HIGHWAY_SMOKE, metric="test_acc")
      for d in (10, 20, 50, 100)],
    *[Chunk(name=f"jsb-d{d}", table="jsb_paper", script="experiments/jsb.py",
            flags=(f"--depths={d}", "--jobs=6"), data=("jsb_chorales",),
            minutes=8.0, smoke=JSB_SMOKE, metric="test_nll", select="valid_nll")
      for d in (1, 2, 4, 6)],
]}  # fmt: skip


# ----------------------------------------------------------------------------- the queue


def read_queue() -> list[dict[str, str]]:
    """The queue's rows (every chunk of :data:`CHUNKS`; one missing there is pending)."""
    rows = {}
    if QUEUE.is_file():
        lines = QUEUE.read_text().splitlines()
        for line in lines[1:]:
            fields = line.split("\t")
            rows[fields[0]] = dict(zip(QUEUE_HEADER, fields + [""] * len(QUEUE_HEADER)))
    return [rows.get(name) or dict.fromkeys(QUEUE_HEADER, "") | {"chunk": name, "state": "pending"}
            for name in CHUNKS]  # fmt: skip


def write_queue(rows: list[dict[str, str]]) -> None:
    text = "\t".join(QUEUE_HEADER) + "\n"
    text += "".join("\t".join(r[k] for k in QUEUE_HEADER) + "\n" for r in rows)
    tmp = QUEUE.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, QUEUE)


def next_pending() -> str:
    for row in read_queue():
        if row["state"] == "pending":
            return row["chunk"]
    raise SystemExit("error: no chunk is pending")


# ----------------------------------------------------------------------- here: prepare


def prepare(name: str, stage: pathlib.Path = STAGE) -> int:
    """Copies the chunk's data and cache files into ``stage`` (``.harvest/``, replacing
    what was there), prints the device call and returns the bytes it carries."""
    chunk = CHUNKS[name]
    data_root = pathlib.Path(os.environ.get("RHNZOO_DATA", ROOT.parent / "shared" / "data"))
    cache_root = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
    shutil.rmtree(stage, ignore_errors=True)
    for d in chunk.data:
        shutil.copytree(data_root / d, stage / "data" / d)
    for f in chunk.cache:
        (stage / "cache" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(cache_root / f, stage / "cache" / f)
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    (stage / "commit.txt").write_text(commit + ("+" if dirty else "") + "\n")
    size = sum(p.stat().st_size for p in stage.rglob("*") if p.is_file())
    if size > CARRY_LIMIT:
        raise SystemExit(f"error: {name} carries {size / 2**20:.1f} MiB, more than 64 MiB")
    print(f"{name}: {size / 2**20:.1f} MiB in .harvest/ (about {chunk.minutes:g} min)")
    print(json.dumps({"command": f"python docs/runs/gpu/harvest.py run {name}",
                      "carry": [".harvest"], "timeout_s": 600}))  # fmt: skip
    return size


# ----------------------------------------------------------------------- the GPU: run


def command(chunk: Chunk, workdir: pathlib.Path, smoke: bool, stack: bool = False) -> list[str]:
    """The chunk's command line; ``stack``: each row's ``--seeds=K`` as one program
    (``--stack_seeds``, ``--jobs`` divided by K), for a chunk with seeds."""
    flags = [*chunk.flags, *(chunk.smoke if smoke else ())]
    seeds = int(_flag(flags, "--seeds") or 1)
    if stack and seeds > 1:
        flags = [*flags, "--stack_seeds", f"--jobs={max(1, int(_flag(flags, '--jobs')) // seeds)}"]
    return [sys.executable, chunk.script, *flags, f"--workdir={workdir}"]


def _flag(flags: list[str], name: str) -> str | None:
    """The last value of ``--name=value`` in ``flags`` (None if absent)."""
    values = [f.split("=", 1)[1] for f in flags if f.startswith(name + "=")]
    return values[-1] if values else None


def run(name: str, out: pathlib.Path, smoke: bool, deadline_s: float = DEADLINE_S,
        stage: pathlib.Path = STAGE, stack: bool = False) -> pathlib.Path:  # fmt: skip
    """Runs the chunk into ``out/<chunk>/`` with the data and cache ``stage`` holds (else
    the environment's), stopped at ``deadline_s`` (``stack``: :func:`command`'s);
    writes and returns ``out/<chunk>.tar.gz`` (the records, ``harvest.json``,
    ``log.txt``)."""
    chunk = CHUNKS[name]
    work = out / name
    shutil.rmtree(work, ignore_errors=True)
    runs = work / "runs"
    runs.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if (stage / "data").is_dir():
        env["RHNZOO_DATA"] = str(stage / "data")
    if (stage / "cache").is_dir():
        env["XDG_CACHE_HOME"] = str(stage / "cache")
    cmd = command(chunk, runs, smoke, stack)
    start = time.time()
    with open(work / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            rc = proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # the runs save and stop
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
    finished = sorted(p.parent.name for p in runs.rglob("results.json"))
    info = {"chunk": name, "table": chunk.table, "smoke": smoke, "returncode": rc,
            "minutes": round((time.time() - start) / 60, 2), "finished": finished,
            "complete": rc == 0, "command": cmd[1:], "date": datetime.date.today().isoformat(),
            "commit": _commit(stage), "device": _device(), "host": os.uname().nodename}  # fmt: skip
    (work / "harvest.json").write_text(json.dumps(info, indent=1) + "\n")
    archive = out / f"{name}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            kept = path.name in KEPT or path.parent == work
            checkpoint = "checkpoints" in path.parts or "best" in path.parts
            if path.is_file() and kept and not checkpoint:
                tar.add(path, arcname=str(path.relative_to(out)))
    print(json.dumps(info))
    return archive


def _commit(stage: pathlib.Path) -> str:
    if (stage / "commit.txt").is_file():
        return (stage / "commit.txt").read_text().strip()
    return _git("rev-parse", "--short", "HEAD") or "unknown"


def _git(*args: str) -> str:
    """``git args``'s output in the checkout ('' where there is no git)."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, text=True, capture_output=True,
                              check=False).stdout.strip()  # fmt: skip
    except OSError:
        return ""


def _device() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             text=True, capture_output=True, timeout=30,
                             check=False).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return out.splitlines()[0] if out else "CPU"


# ----------------------------------------------------------------------- here: record


def record(archive: pathlib.Path, records: pathlib.Path = RECORDS,
           update_queue: bool = True) -> str:  # fmt: skip
    """Unpacks ``archive`` into ``records/<table>/`` (each run's folder replaced), sets
    the chunk's queue row (unless ``update_queue`` is false) and returns the table."""
    with tarfile.open(archive) as tar:
        tar.extractall(archive.parent / "unpacked", filter="data")
    work = next((archive.parent / "unpacked").iterdir())
    info = json.loads((work / "harvest.json").read_text())
    dest = records / info["table"]
    dest.mkdir(parents=True, exist_ok=True)
    for results in sorted((work / "runs").rglob("results.json")):
        run_dir = results.parent
        target = dest / run_dir.relative_to(work / "runs")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(run_dir, target)
    shutil.copy2(work / "log.txt", dest / f"{info['chunk']}.log")
    shutil.copy2(work / "harvest.json", dest / f"{info['chunk']}.json")
    shutil.rmtree(archive.parent / "unpacked")
    if update_queue and not info["smoke"]:
        rows = read_queue()
        for row in rows:
            if row["chunk"] == info["chunk"]:
                row.update(state="done" if info["complete"] else "partial", date=info["date"],
                           device=info["device"], commit=info["commit"],
                           minutes=str(info["minutes"]),
                           note=f"{len(info['finished'])} runs finished")  # fmt: skip
        write_queue(rows)
    chunk = CHUNKS[info["chunk"]]
    return table(dest, chunk.metric, chunk.select)


def table(dest: pathlib.Path, metric: str, select: str | None = None) -> str:
    """The table of ``dest``'s finished runs, written to ``dest/harvest_table.md``: per
    run name, its seeds (``<run>_s<k>``) or random-search trials (``<run>_t<k>``)
    together, the ``metric``'s mean ± sd (n) and best (accuracies in %); with ``select``
    (lower is better), the best is the ``metric`` of the run with the best ``select``."""
    if str(ROOT) not in sys.path:  # run as a script from any directory
        sys.path.insert(0, str(ROOT))
    from rhnzoo.training import tables

    groups: dict[str, list[dict]] = {}
    for results in sorted(dest.rglob("results.json")):
        name = results.parent.relative_to(dest).as_posix()
        base, _, k = name.rpartition("_")
        base = base if k[:1] in ("s", "t") and k[1:].isdigit() else name
        r = json.loads(results.read_text())
        if r.get(metric) is not None:
            groups.setdefault(base, []).append(r)
    acc = metric.endswith("_acc")
    scale = 100.0 if acc else 1.0

    def best(rs):
        if select is not None:
            return min(rs, key=lambda r: r.get(select, float("inf")))[metric]
        return (max if acc else min)(r[metric] for r in rs)

    rows = [(base, tables.mean_sd([r[metric] * scale for r in rs]), f"{best(rs) * scale:.2f}")
            for base, rs in groups.items()]  # fmt: skip
    unit = " %" if acc else ""
    how = f" (at the best {select})" if select else ""
    text = tables.markdown(("run", f"{metric}{unit}, mean ± sd (n)", f"best{how}{unit}"), rows)
    (dest / "harvest_table.md").write_text(text + "\n")
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("list")
    p = sub.add_parser("prepare")
    p.add_argument("chunk", nargs="?")
    p = sub.add_parser("run")
    p.add_argument("chunk")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/rhnzoo-harvest"))
    p.add_argument("--deadline_s", type=float, default=DEADLINE_S)
    p.add_argument("--stack_seeds", action="store_true",
                   help="each row's seeds as one program (--stack_seeds, --jobs / seeds)")
    p = sub.add_parser("record")
    p.add_argument("archive")
    p = sub.add_parser("table")
    p.add_argument("table")
    args = parser.parse_args(argv)
    chunk = getattr(args, "chunk", None)
    if chunk is not None and chunk not in CHUNKS:
        raise SystemExit(f"error: no chunk {chunk!r}; `list` shows them")
    if args.what == "list":
        for row in read_queue():
            print("\t".join(row[k] for k in QUEUE_HEADER).rstrip())
    elif args.what == "prepare":
        prepare(chunk or next_pending())
    elif args.what == "run":
        run(chunk, pathlib.Path(args.out), args.smoke, args.deadline_s, stack=args.stack_seeds)
    elif args.what == "record":
        print(record(pathlib.Path(args.archive)))
    else:
        chunk = next(c for c in CHUNKS.values() if c.table == args.table)
        print(table(RECORDS / args.table, chunk.metric, chunk.select))


if __name__ == "__main__":
    main()
