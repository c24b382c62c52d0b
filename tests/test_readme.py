"""The README's Python code blocks run as written, each in a fresh namespace (a user
pastes one block; it must define what it uses)."""

import pathlib
import re
import shlex

import pytest
from helpers import needs_data

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.M | re.S)


def _case(block: str):
    if "data.load(" in block:  # trains on the real PTB files: 50 steps
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


def test_ci_runs_the_readmes_install_and_test_commands():
    """``.ci/run``'s lines marked ``# README: install`` / ``# README: tests`` are, flag for
    flag, commands of the README's shell blocks, and the README's full-suite commands are
    all in CI (two pytest sessions: the Pallas kernels and the float64 grid in their own)."""
    ci = (README.parent / ".ci" / "run").read_text()
    marked = {
        tag: [
            shlex.split(line, comments=True)
            for line in ci.splitlines()
            if line.rstrip().endswith(f"# README: {tag}")
        ]
        for tag in ("install", "tests")
    }
    shell = [
        shlex.split(line, comments=True)
        for block in re.findall(r"^```bash\n(.*?)^```", README.read_text(), re.M | re.S)
        for line in block.splitlines()
    ]
    assert len(marked["install"]) == 1 and len(marked["tests"]) == 2, marked
    for command in marked["install"] + marked["tests"]:
        assert [w for w in command if w != "-q"] in [[w for w in c if w != "-q"] for c in shell], (
            command
        )
    full_suite = [c for c in shell if "pytest" in c and "--dist" in c]
    assert full_suite == marked["tests"]
    sessions = [c[len(c) - 1 - c[::-1].index("-m") + 1] for c in marked["tests"]]
    assert sessions == ["not pallas and not x64_grid", "pallas or x64_grid"], sessions
