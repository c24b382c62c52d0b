"""Tables rendered from records (``tools.render``, issue 61 part 4): the committed
docs hold exactly what their records give, and a table follows its record."""

import json
import pathlib

import pytest

from tools import render

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
SEEDS = DOCS / "runs/seeds/cpu_e97986c.jsonl"


def test_every_rendered_table_in_the_docs_is_its_records():
    pages = [p for p in sorted(DOCS.glob("*.md")) if "<!-- render:" in p.read_text()]
    assert DOCS / "speed.md" in pages  # the K-seeds table
    for page in pages:
        assert render.render(page) == page.read_text(), (
            f"{page.name}: a table differs from its record; run python -m tools.render"
        )


def _page(tmp_path, records):
    (tmp_path / "seeds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- render: seeds seeds.jsonl -->\nstale\n<!-- /render -->\nafter\n")
    return page


def test_a_table_follows_its_record(tmp_path):
    records = [json.loads(line) for line in SEEDS.read_text().splitlines()]
    text = render.render(_page(tmp_path, records[:1]))
    assert text.startswith("before\n<!-- render: seeds seeds.jsonl -->\n| shape |")
    assert text.endswith("|\n<!-- /render -->\nafter\n") and "stale" not in text
    row = text.splitlines()[4]
    assert row == (
        "| P-MNIST (LSTM 1 -> 100, B 100, T 784) | 583 | 549 (0.94) | 541 (0.93) "
        "| 543 (0.93) | 573 (0.98) | 2.4 GiB (187 MiB) |"
    )
    records[0]["k2_ms_per_seed"], records[0]["k2_steps_ratio"] = 612.4, 1.05
    records[0]["single_peak_bytes_estimate"] = 3 * 2**20
    row = render.render(_page(tmp_path, records[:1])).splitlines()[4]
    assert "| 612 (1.05) |" in row and row.endswith("(3 MiB) |")


def test_an_unknown_kind_or_a_missing_field_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- render: nope r.jsonl -->\n<!-- /render -->\n")
    (tmp_path / "r.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="unknown table kind 'nope'"):
        render.render(page)
    page.write_text("<!-- render: seeds r.jsonl -->\n<!-- /render -->\n")
    with pytest.raises(KeyError):
        render.render(page)
