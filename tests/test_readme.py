"""The README's Python code blocks run as written, each in a fresh namespace (a user
pastes one block; it must define what it uses). The block that trains reads the generated
PTB of ``tests/corpus.py`` through ``RHNZOO_DATA``, its checksums in place of the
published ones: the block's contract is the API, not the data (the real files' checksums
and loading: tests/test_data.py::test_real_ptb)."""

import pathlib
import re
import shlex

import pytest
import corpus

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.M | re.S)


def _case(block: str):
    if "data.load(" in block:  # trains on the generated PTB files: 50 steps
        return pytest.param(block, marks=pytest.mark.slow, id="train_and_evaluate")
    if "Bidirectional(" in block:  # issue 71: "Your own models", with resets
        return pytest.param(block, id="bidirectional_resets")
    for name in ("generate", "export"):  # issue 71: "Your own models"
        if f"{name}." in block:
            return pytest.param(block, id=name)
    return pytest.param(block, id="nnx" if "nnx" in block else "lax_scan")


def test_the_readme_has_its_code_blocks():
    assert len(BLOCKS) == 6, [b.splitlines()[0] for b in BLOCKS]


@pytest.mark.parametrize("block", [_case(b) for b in BLOCKS])
def test_readme_block_runs_as_written(block, tmp_path, monkeypatch, generated_ptb):
    monkeypatch.chdir(tmp_path)  # a block that writes (a workdir) writes here
    monkeypatch.setenv("RHNZOO_DATA", str(generated_ptb.parent))
    from rhnzoo import data

    for name, sha256 in corpus.sha256s(generated_ptb).items():  # verified as the real ones
        monkeypatch.setitem(data.PTB_SHA256, name, sha256)
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    if "ys" in namespace:  # the cell blocks: outputs [T, B, hidden] (batch-major [B, T, n])
        assert namespace["ys"].shape == (35, 20, 256)


def test_ci_runs_the_readmes_install_and_test_commands():
    """``.ci/run``'s lines marked ``# README: install`` / ``# README: tests`` are, flag for
    flag, commands of the README's shell blocks; the README's full-suite command (the one
    with ``--dist``) is CI's one session, which deselects nothing; the README's other
    pytest commands are its tiers: per commit and the kernels, together the fast tests."""
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
    assert len(marked["install"]) == 1 and len(marked["tests"]) == 1, marked
    for command in marked["install"] + marked["tests"]:
        assert [w for w in command if w != "-q"] in [[w for w in c if w != "-q"] for c in shell], (
            command
        )
    full_suite = [c for c in shell if "pytest" in c and "--dist" in c]
    options = {tuple(c): c[c.index("pytest") :] for c in shell if "pytest" in c}  # past -m pytest
    assert full_suite == marked["tests"] and "-m" not in options[tuple(full_suite[0])], full_suite
    tiers = [o[o.index("-m") + 1] for o in options.values() if "-m" in o]
    assert tiers == [
        "not slow and not pallas and not x64_grid",
        "(pallas or x64_grid) and not slow",
    ], tiers
