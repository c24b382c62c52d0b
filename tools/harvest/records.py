"""``record`` (here): a window's archives (``$OUT``, read only) merged into its table's
records, its queue row, and the table of what is recorded (``table``)."""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile

from tools.harvest.chunks import (
    SMOKE_RECORDS,
    HarvestError,
    read_chunks,
    read_json,
    read_queue,
    records_dir,
    unpack,
    write_queue,
)


def record(
    out_dir: pathlib.Path,
    smoke: bool = False,
    records: pathlib.Path | None = None,
    queue: pathlib.Path | None = None,
) -> dict[str, str]:
    """Merges every window archive in ``out_dir`` (read only: it is never written) into
    ``records/<table>/`` (``records``: the window's,
    :func:`~tools.harvest.chunks.records_dir`, a GPU window's apart from a CPU chunk's;
    with ``smoke`` :data:`~tools.harvest.chunks.SMOKE_RECORDS`): each run's folder
    replaced, the window's log and ``harvest.json`` beside them, a partial archive into
    ``partial/`` (a complete window removes its one); without ``smoke``, the window's
    queue row. Returns each table's text. HarvestError: no archive, or an archive whose
    ``smoke`` differs from ``smoke`` (a smoke window never enters a paper table)."""
    if records is None and smoke:
        records = SMOKE_RECORDS
    known = read_chunks(queue)
    archives = sorted(p for p in out_dir.glob("*.tar.gz") if not p.name.endswith(".partial.tar.gz"))
    if not archives:
        raise HarvestError(f"{out_dir}: no window archive (<window>.tar.gz)")
    texts = {}
    with tempfile.TemporaryDirectory() as tmp:
        infos = []
        for archive in archives:
            unpacked = pathlib.Path(tmp) / archive.name.removesuffix(".tar.gz")
            unpack(archive, unpacked)
            work = next(unpacked.iterdir(), None) if unpacked.is_dir() else None
            info = read_json(work / "harvest.json") if work is not None else None
            if not isinstance(info, dict) or info.get("chunk") not in known:
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
            chunk = known[name]
            dest = (records or records_dir(chunk)) / info["table"]
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
            texts[info["table"]] = table(dest, chunk.metric, chunk.select)
        if not smoke:
            write_queue(rows, queue)
    return texts


def _update_queue(rows: list[dict[str, str]], info: dict, resumable: bool) -> None:
    """Window ``info``'s queue row (done or partial: date, device, commit, minutes, a
    note), and for a GPU window the re-size of its table's pending GPU windows: each
    one's estimate times this window's wall time over its own estimate (for a cut
    window a lower bound), so that :func:`~tools.harvest.chunks.check_size` refuses one
    that would now pass the deadline. (Every pending window of a table is re-sized by
    the same factor, so a ratio over the current estimates is one over the first ones.)"""
    name = info["chunk"]
    mine = next(row for row in rows if row["chunk"] == name)
    ratio = info["minutes_total"] / float(mine["estimate"])
    for row in rows:
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
        elif (mine["on"], row["on"], row["table"], row["state"]) == (
            "gpu",
            "gpu",
            mine["table"],
            "pending",
        ):
            least = "" if info["complete"] else " at least"
            row["estimate"] = f"{float(row['estimate']) * ratio:.1f}"
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
        info = read_json(window) or {}
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
