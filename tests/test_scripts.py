"""Every script in experiments/ as a new user first meets it: ``--help``."""

import dataclasses
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (ROOT / "experiments").glob("*.py"))
# A few of each script's own flags that --help must show.
OWN_FLAGS = {
    "ptb.py": ["--depth", "--hsg", "--max_steps", "--max_epochs", "--workdir", "--verify_data",
               "--matmul_precision"],
    "char.py": ["--dataset", "--depth", "--max_steps", "--verify_data", "--matmul_precision"],
    "jsb.py": ["--archs", "--depths", "--max_steps", "--max_epochs", "--verify_data",
               "--matmul_precision"],
    "highway.py": ["--kind", "--depth", "--transform_bias", "--sweep", "--max_epochs",
                   "--matmul_precision"],
    "rrl.py": ["--dataset", "--model", "--table", "--skip", "--patience", "--verify_data",
               "--matmul_precision"],
    "analyze.py": ["--workdir", "--mc_samples", "--flow"],
    "sweep.py": ["--depths", "--root", "--table"],
}


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_the_scripts_own_flags_with_defaults(script):
    result = subprocess.run([sys.executable, str(ROOT / "experiments" / script), "--help"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 1  # absl's convention for --help (README says so)
    assert script in OWN_FLAGS, f"add {script}'s own flags to OWN_FLAGS"
    for flag in OWN_FLAGS[script]:
        assert f"  {flag}" in result.stdout or f"  --[no]{flag[2:]}" in result.stdout, flag
    assert "(default:" in result.stdout
    assert "--logtostderr" not in result.stdout  # absl's own flags stay in --helpfull


def test_every_analysis_setting_is_a_flag_with_help():
    """experiments/analyze.py's flags are report.Options' fields but the tracker, each
    with its help text and the field's default."""
    from absl import flags

    from rhnzoo.analysis import report
    from rhnzoo.apps import cli

    fv = flags.FlagValues()
    names = cli.define_config_flags(report.Options(), flag_values=fv)
    assert sorted(names) == sorted(f.name for f in dataclasses.fields(report.Options)
                                   if f.name != "track")  # fmt: skip
    assert all(fv[n].help and fv[n].default == getattr(report.Options(), n) for n in names)


def test_analyze_of_a_directory_without_a_run_writes_nothing(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "experiments" / "analyze.py"),
                             f"--workdir={tmp_path / 'none'}"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and lines == [f"error: {tmp_path / 'none'} has no config.json; "
                                                "is it an rhnzoo training workdir?"]  # fmt: skip
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", [s if s == "ptb.py" else pytest.param(s, marks=pytest.mark.slow)
                                    for s in SCRIPTS])  # fmt: skip
def test_a_stray_positional_argument_is_one_error_line(script, tmp_path):
    """``ptb.py --max_steps=2 foo`` must not run with ``foo`` ignored (nor sweep.py pass it
    on to every run): one ``error:`` line, exit status 1, nothing written."""
    extra = ["--dry_run"] if script == "sweep.py" else []
    result = subprocess.run([sys.executable, str(ROOT / "experiments" / script), *extra,
                             "--max_steps=2" if script == "ptb.py" else "--help=false", "foo"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: unexpected arguments foo") and not list(tmp_path.iterdir())


@pytest.mark.slow
def test_sweep_unknown_flag_is_one_error_line(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "experiments" / "sweep.py"), "--bogus=1"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "bogus" in lines[0] and list(tmp_path.iterdir()) == []


def test_analyze_help_names_workdirs_that_ptb_py_creates():
    """The example workdirs in analyze.py's help are the default workdirs of the ptb.py
    runs they follow (``--preset=small``; ``--nohsg --depth=10``)."""
    import re

    from rhnzoo.configs import lm as presets

    text = (ROOT / "experiments" / "analyze.py").read_text()
    named = set(re.findall(r"--workdir=(runs/ptb\S*)", text))
    made = {presets.get_config("small").run_dir,
            presets.get_config(depth=10, hsg=False).run_dir}  # fmt: skip
    assert named and named <= made, named - made
