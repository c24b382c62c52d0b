"""The README's Python code blocks run as written, each in a fresh namespace (a user
pastes one block; it must define what it uses)."""

import pathlib
import re

import pytest
from helpers import needs_data

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.M | re.S)


def _case(block: str):
    if "data.load(" in block:  # trains on the real PTB files: 200 steps
        marks = [pytest.mark.slow, needs_data("ptb", "ptb.train.txt", what="PTB")]
        return pytest.param(block, marks=marks, id="train_and_evaluate")
    return pytest.param(block, id="nnx" if "nnx" in block else "lax_scan")


def test_the_readme_has_its_code_blocks():
    assert len(BLOCKS) == 3, [b.splitlines()[0] for b in BLOCKS]


@pytest.mark.parametrize("block", [_case(b) for b in BLOCKS])
def test_readme_block_runs_as_written(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a block that writes (a workdir) writes here
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    if "ys" in namespace:  # the cell blocks: outputs [T, B, hidden] (batch-major [B, T, n])
        assert namespace["ys"].shape == (35, 20, 256)
