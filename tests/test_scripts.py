"""Every script in experiments/ as a new user first meets it: ``--help`` (one run a
script; highway.py's is tests/test_highway_experiment.py's, which checks every field).
Bad input: tests/test_bad_inputs.py."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (ROOT / "experiments").glob("*.py"))
HELP_ELSEWHERE = {"highway.py"}  # test_highway_experiment.py runs its --help
# A few of each script's own flags that --help must show.
OWN_FLAGS = {
    "ptb.py": [
        "--depth",
        "--hsg",
        "--max_steps",
        "--max_epochs",
        "--workdir",
        "--verify_data",
        "--matmul_precision",
    ],
    "char.py": ["--dataset", "--depth", "--max_steps", "--verify_data", "--matmul_precision"],
    "jsb.py": [
        "--archs",
        "--depths",
        "--max_steps",
        "--max_epochs",
        "--verify_data",
        "--matmul_precision",
    ],
    "rrl.py": [
        "--dataset",
        "--model",
        "--table",
        "--skip",
        "--patience",
        "--verify_data",
        "--matmul_precision",
    ],
    "analyze.py": ["--workdir", "--mc_samples", "--flow"],
    "generate.py": ["--workdir", "--num_tokens", "--prompt", "--temperature", "--top_k", "--seed"],
    "export.py": ["--workdir", "--out", "--platforms"],
    "sweep.py": ["--depths", "--root", "--table"],
}


@pytest.mark.parametrize(  # the fast tier: ptb.py's (one generator makes every script's flags)
    "script",
    [
        pytest.param(s, marks=() if s == "ptb.py" else pytest.mark.slow)
        for s in sorted(set(SCRIPTS) - HELP_ELSEWHERE)
    ],
)
def test_help_lists_the_scripts_own_flags_with_defaults(script):
    result = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1  # absl's convention for --help (README says so)
    assert script in OWN_FLAGS, f"add {script}'s own flags to OWN_FLAGS"
    for flag in OWN_FLAGS[script]:
        assert f"  {flag}" in result.stdout or f"  --[no]{flag[2:]}" in result.stdout, flag
    assert "(default:" in result.stdout
    assert "--logtostderr" not in result.stdout  # absl's own flags stay in --helpfull


def test_analyze_help_names_workdirs_that_ptb_py_creates():
    """The example workdirs in analyze.py's help are the default workdirs of the ptb.py
    runs they follow (``--preset=small``; ``--nohsg --depth=10``)."""
    import re

    from rhnzoo.configs import lm as presets

    text = (ROOT / "experiments" / "analyze.py").read_text()
    named = set(re.findall(r"--workdir=(runs/ptb\S*)", text))
    made = {presets.get_config("small").run_dir, presets.get_config(depth=10, hsg=False).run_dir}
    assert named and named <= made, named - made
