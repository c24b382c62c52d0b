"""Writes the per-test time table ``tests/durations.json`` ({nodeid: CPU-s}) that
``tests/conftest.py`` orders the suite's files by (costliest first), from the lines a run
with ``RHNZOO_TEST_TIMES`` appended (one JSON line per test: ``nodeid``, ``cpu_s``...):

  RHNZOO_TEST_TIMES=/tmp/t.jsonl python -m pytest -q -n 2 --dist worksteal
  python tests/durations.py /tmp/t.jsonl

A test listed twice (two runs in one log) keeps its last time; the table is sorted by node
id, so a remade table's diff shows what moved.
"""

import json
import pathlib
import sys

TABLE = pathlib.Path(__file__).resolve().parent / "durations.json"


def table(lines: list[str]) -> dict[str, float]:
    times = {}
    for line in lines:
        if line.strip():
            row = json.loads(line)
            times[row["nodeid"]] = round(float(row["cpu_s"]), 1)
    return dict(sorted(times.items()))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/durations.py TIMES.jsonl")
    times = table(pathlib.Path(sys.argv[1]).read_text().splitlines())
    TABLE.write_text(json.dumps(times, indent=0) + "\n")
    print(f"{TABLE}: {len(times)} tests, {sum(times.values()):.0f} CPU-s")
