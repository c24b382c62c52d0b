"""The highway report's comparison at 400 epochs from the harvest's records (issue 72):
training cross-entropy and test accuracy per depth, plain beside highway, and the figure
of training cross-entropy against depth (Srivastava et al. Fig. 1's finding, the report's
Fig. 8), from ``docs/runs/cpu/harvest/highway_mnist_paper/<kind>_d<depth>[_s<k>]/``.

  python -m tools.highway_400                      # the table (markdown) on stdout
  python -m tools.highway_400 --figure=docs/highway/training_ce_400_epochs.png

A run counts when it finished (``results.json``); its training cross-entropy is its last
epoch's mean (nats, the report's measure), its test accuracy that of its best-validation
parameters. Several seeds: mean ± sd (n).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs/runs/cpu/harvest/highway_mnist_paper"
_RUN = re.compile(r"(plain|highway)_d(\d+)(?:_s\d+)?")
# The report's text on its Fig. 8 (shared/papers/001_777c40708440fb61.txt, sec. IV): plain
# nets of 10 and 20 layers end "between 10^-3 and 10^-4"; no number is given for the others.
REPORT_PLAIN_10_20 = (1e-4, 1e-3)


def runs(records: pathlib.Path = RECORDS) -> dict[tuple[str, int], list[dict]]:
    """``{(kind, depth): [{'train_xent', 'test_acc', 'epochs'}, ...]}`` over the finished
    runs (one per seed)."""
    out: dict[tuple[str, int], list[dict]] = {}
    for folder in sorted(records.glob("*_d*")):
        match = _RUN.fullmatch(folder.name)
        if not match or not (folder / "results.json").is_file():
            continue
        epochs = [
            json.loads(line)
            for line in (folder / "metrics.jsonl").read_text().splitlines()
            if '"kind": "epoch"' in line
        ]
        results = json.loads((folder / "results.json").read_text())
        out.setdefault((match[1], int(match[2])), []).append(
            {
                "train_xent": epochs[-1]["train_xent"],
                "test_acc": results["test_acc"],
                "epochs": epochs[-1]["epoch"],
            }
        )
    return out


def _cell(values: list[float], fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{statistics.mean(values):{fmt}} ± {statistics.stdev(values):{fmt}} ({len(values)})"


def table(found: dict[tuple[str, int], list[dict]]) -> str:
    """The markdown table: per depth, each kind's training CE and test accuracy."""
    rows = [
        "| depth | plain: train CE (nats) | plain: test acc % | highway: train CE (nats) "
        "| highway: test acc % |",
        "|---:|---:|---:|---:|---:|",
    ]
    for depth in sorted({d for _, d in found}):
        cells = [str(depth)]
        for kind in ("plain", "highway"):
            got = found.get((kind, depth))
            if not got:
                cells += ["pending", "pending"]
                continue
            cells.append(_cell([r["train_xent"] for r in got], ".2e"))
            cells.append(_cell([100 * r["test_acc"] for r in got], ".2f"))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def figure(found: dict[tuple[str, int], list[dict]], path: pathlib.Path) -> pathlib.Path:
    """Training cross-entropy after 400 epochs against depth, plain and highway (log
    scale), the report's stated range for its plain nets at depths 10 and 20 beside."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for kind, style in (("plain", "o-"), ("highway", "s-")):
        depths = sorted(d for k, d in found if k == kind)
        means = [statistics.mean(r["train_xent"] for r in found[(kind, d)]) for d in depths]
        ax.plot(depths, means, style, label=f"{kind} (ours, 400 epochs)")
    low, high = REPORT_PLAIN_10_20
    ax.fill_between([10, 20], low, high, alpha=0.2, color="C0", label="report: plain d10, d20")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks([10, 20, 50, 100], ["10", "20", "50", "100"])
    ax.set_xlabel("depth (layers)")
    ax.set_ylabel("training cross-entropy, last epoch (nats)")
    ax.set_title("MNIST: plain vs highway nets after 400 epochs")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=pathlib.Path, default=RECORDS)
    parser.add_argument("--figure", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    found = runs(args.records)
    if not found:
        parser.exit(1, f"error: no finished run under {args.records}\n")
    print(table(found), end="")
    if args.figure:
        print(f"wrote {figure(found, args.figure)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
