"""The harvest's command line: ``python -m tools.harvest list | next | prepare | run |
record | table`` (see :mod:`tools.harvest`)."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

from tools import harvest
from tools.harvest.chunks import (
    CHUNKS,
    CPU_LIMIT_S,
    DEADLINE_S,
    HarvestError,
    chunk_of,
    read_queue,
    records_dir,
)
from tools.harvest.device import _check_deadline, run
from tools.harvest.records import record, table
from tools.harvest.stage import prepare
from tools.harvest.windows import next_window


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.harvest", description=harvest.__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("list", help="the queue")
    sub.add_parser(
        "next", help="the next GPU window (the harvest's or the kernels'), its exact call"
    )
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
        help="default: the window's, docs/runs/gpu/harvest or docs/runs/cpu/harvest "
        "(--smoke: runs/harvest_smoke)",
    )
    p = sub.add_parser("table", help="the table of what is recorded")
    p.add_argument("table")
    args = parser.parse_args(argv)
    try:
        if getattr(args, "window", None) is not None:
            chunk_of(args.window)
        if args.what == "list":
            shown = ("chunk", "on", "estimate", "state", "date", "device", "commit", "minutes")
            for row in read_queue():
                print("\t".join(row[k] for k in (*shown, "note")).rstrip())
        elif args.what == "next":
            step = next_window()
            print(f"next window: {step['window']} {step['name']} ({step['why']})")
            if step["before"]:
                print(f"here first: {step['before']}")
            print(f"the device call: {json.dumps(step['call'])}")
            print(f"then here: {step['after']}")
            print(json.dumps(step))
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
            print(table(records_dir(chunk) / args.table, chunk.metric, chunk.select))
    except HarvestError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
