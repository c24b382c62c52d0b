r"""Tables in the docs rendered from the records under ``docs/runs/`` (issue 61 part 4): a
tool of the project, beside the package (issue 70).

  python -m tools.render            # rewrite every rendered table in docs/*.md
  python -m tools.render --check    # exit 1 if a committed table differs from its record

A rendered table sits between two HTML comments in a page, the first naming its kind and
its record (a JSON-lines file, relative to the page)::

    <!-- render: seeds runs/seeds/cpu_e97986c.jsonl -->
    | shape | one step | ... |
    <!-- /render -->

so a figure in the page is the record's, rounded, never typed by hand. Kinds:
``seeds`` (:func:`seeds_table`, the JSON lines of :mod:`rhnzoo.bench.seeds`). Only
records kept as JSON lines can be rendered; the prose records (``docs/runs/cpu/*.md``)
are quoted with a link.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
from collections.abc import Callable

# The shapes of rhnzoo.bench.seeds' configurations, as the tables label them.
SEED_SHAPES = {
    "pmnist": "P-MNIST (LSTM 1 -> 100, B 100, T 784)",
    "imdb": "IMDB (256 -> LSTM 512, B 32, T 400)",
    "ptb_sota": "`ptb_sota` (RHN 830 x 10, B 20, T 35)",
}
SEED_KS = (1, 2, 4, 8)
_BLOCK = re.compile(r"(<!-- render: (\S+) (\S+) -->\n)(.*?)(<!-- /render -->)", re.DOTALL)


def seeds_table(records: list[dict]) -> str:
    """The K-seeds table of docs/speed.md from :mod:`rhnzoo.bench.seeds`' JSON lines: per
    configuration the unstacked step's ms (min), per K the ms per seed and, in brackets,
    K seeds' step over K separate steps, and the compiled step's peak memory estimate at
    the largest K (GiB) with the unstacked step's (MiB) in brackets. Raises KeyError for a
    configuration or K the record lacks."""
    big = SEED_KS[-1]
    rows = [
        "| shape | one step | "
        + " | ".join(f"K = {k}" for k in SEED_KS)
        + f" | memory, K = {big} |",
        "|---|" + "---:|" * (len(SEED_KS) + 2),
    ]
    for r in records:
        cells = [SEED_SHAPES[r["config"]], f"{r['single_step_ms_min']:.0f}"]
        cells += [f"{r[f'k{k}_ms_per_seed']:.0f} ({r[f'k{k}_steps_ratio']:.2f})" for k in SEED_KS]
        cells.append(
            f"{r[f'k{big}_peak_bytes_estimate'] / 2**30:.1f} GiB "
            f"({r['single_peak_bytes_estimate'] / 2**20:.0f} MiB)"
        )
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


KINDS: dict[str, Callable[[list[dict]], str]] = {"seeds": seeds_table}


def render(page: pathlib.Path) -> str:
    """``page``'s text with every rendered table rebuilt from its record. Raises
    ValueError for an unknown kind, OSError for a missing record."""

    def one(m: re.Match) -> str:
        kind, record = m.group(2), m.group(3)
        if kind not in KINDS:
            raise ValueError(f"{page}: unknown table kind {kind!r} (known: {', '.join(KINDS)})")
        lines = (page.parent / record).read_text().splitlines()
        table = KINDS[kind]([json.loads(line) for line in lines if line.strip()])
        return m.group(1) + table + m.group(5)

    return _BLOCK.sub(one, page.read_text())


def main(argv: list[str]) -> int:
    check = "--check" in argv[1:]
    docs = pathlib.Path(__file__).resolve().parents[1] / "docs"
    stale = []
    for page in sorted(docs.glob("*.md")):
        text = page.read_text()
        if "<!-- render:" not in text:
            continue
        new = render(page)
        if new != text:
            stale.append(page.name)
            if not check:
                page.write_text(new)
    if check and stale:
        print(
            f"error: tables differ from their records in {', '.join(stale)} "
            "(python -m tools.render)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
