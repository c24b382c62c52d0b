"""Every window of the harvest's queue once through the device simulation (issue 57):
``prepare --smoke`` here, the exact device command in the GPU image's environment (the
helpers of tests/test_device_simulation.py: rhnzoo only through ``PYTHONPATH``,
gensim / tensorflow_datasets / tensorboardX blocked, no data or caches but what the
stage carries, ``$OUT`` empty), the device tool's limits on what comes back, and
``record --smoke`` from a read-only copy of ``$OUT`` into a scratch table. CPU chunks go
the same way (their own stage). Writes a markdown record::

  python tests/simulate_queue.py [--out docs/runs/gpu/harvest/simulation.md] [WINDOW ...]

Not a pytest file (all 38 windows take tens of CPU-minutes): CI runs one window per
table (test_device_simulation.py); this is its record for every window, run once per
change of the queue."""

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))  # tools/

from test_device_simulation import ROOT, device_call, image_tree, read_only_copy

from tools import harvest


def simulate(name: str, tree: pathlib.Path, tmp: pathlib.Path) -> dict:
    """One window: its row of the record (``ok``, seconds, what came back, the table)."""
    start, chunk = time.time(), harvest.CHUNKS[name]
    records, out = tmp / "records", tmp / f"out-{name}"
    row = {"window": name, "on": chunk.device, "ok": False}
    try:
        call = harvest.prepare(name, smoke=True, root=tree, records=records, log=lambda s: None)
        proc = device_call(tree, call, out, tmp / "home")
        row["rc"] = proc.returncode
        back = harvest.check_out(out) if out.is_dir() else ["no $OUT"]
        files = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
        row["files"] = files
        summary = json.loads((out / "summary.json").read_text()) if "summary.json" in files else {}
        row["finished"] = len(summary.get("finished", []))
        assert proc.returncode == 0, proc.stderr[-1500:]
        assert back == [] and files == sorted([f"{name}.tar.gz", "summary.json"]), (back, files)
        assert summary["complete"] and summary["smoke"] and summary["finished"], summary
        texts = harvest.record(
            read_only_copy(out, tmp / f"back-{name}"),
            smoke=True,
            records=records,
            queue=tmp / "queue.tsv",
        )
        rows = [r for r in texts[chunk.table].splitlines()[2:]]
        assert rows, texts
        row["table_rows"] = len(rows)
        row["ok"] = not (tmp / "queue.tsv").exists()  # a smoke window never enters the queue
    except (AssertionError, OSError, KeyError, ValueError, harvest.HarvestError) as e:
        # one window's failure is a row of the record
        row["error"] = f"{type(e).__name__}: {str(e)[-600:]}".replace("\n", " ")
    row["seconds"] = round(time.time() - start, 1)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("windows", nargs="*", help="default: every window of the queue")
    parser.add_argument("--out", default=str(harvest.RECORDS["gpu"] / "simulation.md"))
    args = parser.parse_args()
    names = args.windows or list(harvest.CHUNKS)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        [
            "git",
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            "rhnzoo",
            "experiments",
            "tools",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        tree = image_tree(tmp / "tree")
        for name in names:
            rows.append(simulate(name, tree, tmp))
            r = rows[-1]
            print(f"{name}: {'ok' if r['ok'] else 'FAILED'} in {r['seconds']} s", flush=True)
    passed = sum(r["ok"] for r in rows)
    lines = [
        "# The queue's windows through the device simulation",
        "",
        (
            f"`python tests/simulate_queue.py`, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}"
            f" UTC, commit {commit}{' (with uncommitted changes to the package or the tools)' if dirty else ''},"
            f" {platform.node()} ({os.cpu_count()} cores, shared), under nice."
        ),
        "Each window: `prepare --smoke`, the device command in the image's environment, the",
        "limits on `$OUT`, `record --smoke` from a read-only copy (see the script's docstring).",
        "",
        f"**{passed} of {len(rows)} windows passed.**",
        "",
        "| window | on | passed | s | files back | runs finished | table rows | error |",
        "|---|---|---|---:|---|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['window']}` | {r['on']} | {'yes' if r['ok'] else '**no**'} | {r['seconds']} "
            f"| {', '.join(r.get('files', []))} | {r.get('finished', '')} "
            f"| {r.get('table_rows', '')} | {r.get('error', '').replace('|', '/')[:300]} |"
        )
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"{passed} of {len(rows)} passed; {args.out}")
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
