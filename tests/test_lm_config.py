"""The language model's one config (rhnzoo.configs.lm.LMConfig), its presets
(rhnzoo.configs.lm) and the depth sweep's runs on the one runner."""

import dataclasses
import json

import numpy as np
import pytest
from absl import flags

from rhnzoo import data
from rhnzoo.apps import cli
from rhnzoo.studies import hsg_depth
from rhnzoo.config import setting
from rhnzoo.configs import lm as lm_configs
from rhnzoo.tasks import lm as lm_training
from rhnzoo.configs.lm import LMConfig
from rhnzoo.engine import workdir as workdir_lib

# config.json of `ptb.py --preset=small --hsg --workdir=/tmp/x --max_steps=3`, as the code
# before LMConfig (commit 0016358) wrote it.
OLD_CONFIG_JSON = """{"batch_size": 20, "checkpoint_every_steps": 0, "coordinator_address": null,
"coupled": true, "data_dir": null, "dataset": "ptb", "depth": 3, "distributed": false,
"divergence_factor": 3.0, "download": true, "drop_h": 0.1, "drop_i": 0.3, "drop_o": 0.3,
"drop_x": 0.1, "dtype": "float32", "eval_batch_size": null, "eval_num_steps": 200,
"hidden_size": 256, "hsg": true, "hsg_init_bias": -2.5, "init_bias": -2.5, "init_scale": 0.04,
"log_every": 100, "lr": 0.5, "lr_decay": 2.0, "matmul_precision": "default", "max_epoch": 4,
"max_epochs": null, "max_grad_norm": 5.0, "max_max_epoch": 8, "max_steps": 3,
"num_processes": null, "num_steps": 35, "patience": null, "preset": "small",
"process_id": null, "progress": true, "remat": false, "scan_impl": "auto", "seed": 0,
"tensorboard": false, "tied": true, "unroll": 1, "verify_data": true, "weight_decay": 1e-07,
"workdir": "/tmp/x"}"""


def test_an_earlier_config_json_resumes(tmp_path):
    """A workdir written before later fields existed (no ``cell``) resumes: a missing
    field counts as its default; the config.json is then rewritten with every field."""
    old = json.loads(OLD_CONFIG_JSON)
    config = LMConfig.from_dict(old)
    assert config.to_dict() == {**old, "cell": "rhn", "distributed_timeout": 300}
    assert config.run_dir == "/tmp/x" and config.metric == "ppl"
    (tmp_path / "config.json").write_text(OLD_CONFIG_JSON)
    workdir_lib.prepare_workdir(tmp_path, config, check_only=True)  # no error: resumable
    assert config.replace(workdir=None).run_dir == "runs/ptb_small_d3_n256_hsg"
    assert LMConfig.from_dict(config.to_dict()) == config


def test_resume_refuses_a_structural_change_and_records_a_resumable_one(tmp_path):
    config = LMConfig.from_dict(json.loads(OLD_CONFIG_JSON))
    (tmp_path / "config.json").write_text(OLD_CONFIG_JSON)
    (tmp_path / "results.json").write_text("{}")  # the workdir holds a run
    with pytest.raises(
        ValueError,
        match=r"holds an incompatible run \(cell='rhn' there vs "
        r"'gru'.*hidden_size=256 there vs 8",
    ):
        workdir_lib.prepare_workdir(tmp_path, config.replace(cell="gru", depth=10, hidden_size=8))
    longer = config.replace(max_steps=80, eval_batch_size=10, unroll=2)  # resumable
    workdir_lib.prepare_workdir(tmp_path, longer)
    assert json.loads((tmp_path / "config.json").read_text()) == longer.to_dict()


def test_a_new_setting_is_one_field(tmp_path):
    """Issue 46's acceptance: a setting added in one line is a flag with its help, is
    written to config.json, and a workdir written without it resumes (at its default);
    another value of it is refused, as it is structural."""

    @dataclasses.dataclass(frozen=True)
    class Extended(LMConfig):
        label_smoothing: float = setting(0.0, "Label smoothing of the targets.", low=0.0)

    fv = flags.FlagValues()
    names = cli.define_config_flags(Extended(), ["small"], flag_values=fv)
    assert "label_smoothing" in names and "preset" in fv
    fv(["prog", "--label_smoothing=0.1", "--depth=3"])
    assert fv["label_smoothing"].help == "Label smoothing of the targets."
    assert fv["label_smoothing"].default == 0.0
    given = {n: fv[n].value for n in names if fv[n].present}
    assert given == {"label_smoothing": 0.1, "depth": 3}
    assert Extended(**given).to_dict()["label_smoothing"] == 0.1
    with pytest.raises(ValueError, match="^--label_smoothing must be >= 0.0, got -1.0$"):
        Extended(label_smoothing=-1.0)
    (tmp_path / "config.json").write_text(OLD_CONFIG_JSON)
    (tmp_path / "results.json").write_text("{}")
    before = Extended.from_dict(json.loads(OLD_CONFIG_JSON))
    workdir_lib.prepare_workdir(tmp_path, before, check_only=True)
    with pytest.raises(ValueError, match="label_smoothing=0.0 there vs 0.1"):
        workdir_lib.prepare_workdir(tmp_path, before.replace(label_smoothing=0.1), check_only=True)


@pytest.mark.parametrize(
    "values,message",
    [
        ({"drop_o": 1.0}, "drop_o must be a drop probability in [0, 1), got 1.0"),
        ({"cell": "lstm", "depth": 5}, "--depth does not apply to --cell=lstm (its options: "),
        ({"cell": "gru", "init_bias": -1.0}, "--init_bias does not apply to --cell=gru"),
        ({"hsg_init_bias": -1.0}, "--hsg_init_bias=-1.0 sets the Highway State Gate's bias"),
        (
            {"dtype": "bfloat16", "scan_impl": "reference"},
            "dtype=bfloat16 needs the fused or pallas scan",
        ),
        (
            {"cell": "dtrnn", "scan_impl": "fused"},
            "scan_impl='fused' cannot run DTRNN; its scans: reference",
        ),
        ({"dataset": "mnist"}, "mnist"),
    ],
)
def test_bad_settings_are_one_line_errors(values, message):
    """The LM's own rules (between fields, beyond a field's type, bounds and choices:
    those of every field are tests/test_config_contract.py's)."""
    with pytest.raises(ValueError) as e:
        LMConfig(**values)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_ptb_sota_is_the_reference_configuration():
    """Zilly et al. 2017, rhn_train.py ``ptb_sota``: 10 micro-layers of 830 units, tied,
    SGD lr 0.2 decayed by 1.02 after epoch 20 of 500, clipping 10, weight decay 1e-7,
    35 steps x 20 rows, dropout x/i/h/o 0.25/0.75/0.25/0.75, T bias -2, init 0.04."""
    c = lm_configs.get_config()
    assert (c.depth, c.hidden_size, c.tied) == (10, 830, True)
    assert (c.init_bias, c.init_scale) == (-2.0, 0.04)
    assert (c.lr, c.lr_decay, c.max_epoch, c.max_max_epoch) == (0.2, 1.02, 20, 500)
    assert (c.max_grad_norm, c.weight_decay, c.num_steps, c.batch_size) == (10.0, 1e-7, 35, 20)
    assert (c.drop_x, c.drop_i, c.drop_h, c.drop_o) == (0.25, 0.75, 0.25, 0.75)
    assert c == LMConfig() and c.preset is None


def test_enwik8_sota_and_the_presets():
    """rhn_train.py ``enwik8_sota`` (= ``text8_sota``): 10 x 1500 untied, lr 0.2 decayed by
    1.03 after epoch 5, 50 steps x 128 rows, dropout 0.1/0.4/0.1/0.4, T bias -4."""
    for dataset in ("enwik8", "text8"):
        c = lm_configs.get_config(dataset=dataset)
        assert (c.dataset, c.depth, c.hidden_size) == (dataset, 10, 1500)
        assert (c.tied, c.init_bias) == (False, -4.0)
        assert (c.lr, c.lr_decay, c.max_epoch, c.num_steps, c.batch_size) == (0.2, 1.03, 5, 50, 128)
        assert (c.drop_x, c.drop_i, c.drop_h, c.drop_o) == (0.1, 0.4, 0.1, 0.4)
    small = lm_configs.get_config("small")
    assert (small.preset, small.hidden_size, small.depth) == ("small", 256, 3)
    assert (small.lr, small.max_max_epoch, small.drop_i) == (0.5, 8, 0.3)
    char = lm_configs.get_config("small", dataset="ptb_char")
    assert (char.batch_size, char.num_steps, char.drop_i, char.metric) == (64, 50, 0.0, "bpc")
    assert lm_configs.char_sets() == ["ptb_char", "enwik8", "text8"]
    with pytest.raises(ValueError, match="^--preset must be one of small, got 'large'$"):
        lm_configs.get_config("large")


def test_get_config_gives_an_hsg_model_the_papers_rhn_gate_bias():
    """Shoham & Permuter: "An initial bias of -2.5 was used for both the RHN and the HSG
    gates", in code as on the command line, unless the preset or the caller sets it."""
    d40 = lm_configs.get_config(depth=40, hsg=True)
    assert (d40.depth, d40.hsg, d40.init_bias, d40.hsg_init_bias) == (40, True, -2.5, -2.5)
    # one rule (LMConfig's), whichever way the config is made
    assert LMConfig(hsg=True).init_bias == LMConfig().replace(hsg=True).init_bias == -2.5
    assert LMConfig(hsg=True) == lm_configs.get_config(hsg=True)
    assert LMConfig(hsg=True).replace(hsg=False).init_bias == -2.0
    assert LMConfig(hsg=True, init_bias=-1.0).replace(depth=3).init_bias == -1.0
    assert lm_configs.get_config(dataset="enwik8", hsg=True).init_bias == -2.5  # not -4
    assert lm_configs.get_config(hsg=True, init_bias=-1.0).init_bias == -1.0
    assert lm_configs.get_config("small", "ptb_char", hsg=True).init_bias == -1.0  # the preset's
    assert lm_configs.get_config(depth=40).init_bias == -2.0
    # a preset's cell settings go to the cells that have them; a recorded config.json
    # with a preset's depth for an LSTM (written before the check) still reads
    assert lm_configs.get_config("small", cell="lstm").depth == 10
    old = {**json.loads(OLD_CONFIG_JSON), "cell": "lstm", "hsg": False, "init_bias": -2.0}
    assert LMConfig.from_dict(old).depth == 10
    assert lm_configs.get_config("small", lr=0.1) == lm_configs.get_config("small").replace(lr=0.1)
    for settings, message in [
        ({"learning_rate": 0.1}, "unknown LMConfig setting"),
        ({"depth": 0}, "depth"),
    ]:
        with pytest.raises(ValueError, match=message):
            lm_configs.get_config(**settings)


def test_a_diverging_sweep_run_ends_with_its_results_and_is_named(tmp_path):
    """The depth sweep on the runner: the run that diverges stops there (its results say
    so) and train_all names it; the other run finishes. At lr 1e30 the loss overflows to
    non-finite within 3 steps on XLA:CPU; on an H100 it stayed finite and huge, so the
    wild run has the steps to be judged by its window mean (step 70) too."""
    rng = np.random.default_rng(0)
    tokens = lambda n: rng.integers(0, 12, n).astype(np.int32)
    corpus = data.Corpus(tokens(400), tokens(100), tokens(100), tuple("abcdefghijkl"))
    base = LMConfig(
        hidden_size=8,
        depth=1,
        batch_size=4,
        num_steps=5,
        max_steps=3,
        progress=False,
        eval_batch_size=4,
        eval_num_steps=20,
        max_grad_norm=1e30,
    )
    configs = [
        ("fine", base.replace(lr=0.1, workdir=str(tmp_path / "fine"))),
        ("wild", base.replace(lr=1e30, max_steps=80, workdir=str(tmp_path / "wild"))),
    ]
    lines = []
    failed = hsg_depth.train_all(configs, tmp_path, lambda: corpus, log=lines.append)
    assert failed == ["wild"]
    results = json.loads((tmp_path / "wild" / "results.json").read_text())
    assert results["stopped"] == "diverged"
    assert "non-finite" in results["diverged"] or "above the chance level" in results["diverged"]
    assert "diverged" not in json.loads((tmp_path / "fine" / "results.json").read_text())
    assert lines[0].startswith("[1/2] fine")
    assert any(line.startswith("[2/2] wild") for line in lines)
    on_disk = json.loads((tmp_path / "fine" / "config.json").read_text())
    assert on_disk == configs[0][1].to_dict()


def test_depth_sweep_with_stacked_seeds_trains_a_row_s_seeds_as_one_run(tmp_path):
    """``--stack_seeds``: a row's two seeds train as one program (one ``[1/1]`` run, the
    stacked state in the first seed's workdir), each seed's results in its own workdir and
    equal to its run alone (the LM's stacked step is the same program per seed)."""
    from rhnzoo.studies import sweep

    rng = np.random.default_rng(1)
    tokens = lambda n: rng.integers(0, 12, n).astype(np.int32)
    corpus = data.Corpus(tokens(400), tokens(100), tokens(100), tuple("abcdefghijkl"))
    base = LMConfig(
        hidden_size=8,
        depth=1,
        batch_size=4,
        num_steps=5,
        max_steps=3,
        progress=False,
        eval_batch_size=4,
        eval_num_steps=20,
    )
    rows = lambda root: [
        (
            sweep.seed_name("d1", k),
            base.replace(seed=k, workdir=str(root / sweep.seed_name("d1", k))),
        )
        for k in range(2)
    ]
    lines = []
    stacked = tmp_path / "stacked"
    assert (
        hsg_depth.train_all(
            rows(stacked),
            stacked,
            lambda: corpus,
            log=lines.append,
            jobs=sweep.Jobs(stack_seeds=True),
            seeds=2,
        )
        == []
    )
    assert lines[0].startswith("[1/1] d1") and (stacked / "d1" / "stacked" / "seeds.json").is_file()
    alone = tmp_path / "alone"
    hsg_depth.train_all(rows(alone), alone, lambda: corpus, log=None, seeds=2)
    for name in ("d1", "d1_s1"):
        got = json.loads((stacked / name / "results.json").read_text())
        want = json.loads((alone / name / "results.json").read_text())
        assert got["test_ppl"] == pytest.approx(want["test_ppl"], rel=1e-6)
    assert got["test_ppl"] != json.loads((stacked / "d1" / "results.json").read_text())["test_ppl"]


def test_train_and_evaluate_is_the_one_entry_point(tmp_path):
    rng = np.random.default_rng(1)
    corpus = data.Corpus(
        *(rng.integers(0, 9, n).astype(np.int32) for n in (300, 80, 80)), tuple("abcdefghi")
    )
    config = LMConfig(
        cell="gru",
        hidden_size=8,
        batch_size=4,
        num_steps=5,
        max_steps=2,
        progress=False,
        eval_batch_size=4,
        workdir=str(tmp_path / "w"),
    )
    results = lm_training.train_and_evaluate(config, corpus, log=None)
    assert results["step"] == 2 and np.isfinite(results["test_ppl"])
    assert json.loads((tmp_path / "w" / "config.json").read_text())["cell"] == "gru"


def test_a_single_run_writes_its_learning_curves(tmp_path):
    """Issue 48: after a single run, ``<workdir>/learning_curves.png`` (validation and
    training perplexity against the epoch) and one line naming it; nothing for a
    workdir without epoch records."""

    rng = np.random.default_rng(2)
    corpus = data.Corpus(
        *(rng.integers(0, 9, n).astype(np.int32) for n in (200, 80, 80)), tuple("abcdefghi")
    )
    config = LMConfig(
        hidden_size=8,
        depth=1,
        batch_size=4,
        num_steps=5,
        max_max_epoch=2,
        max_epoch=1,
        progress=False,
        eval_batch_size=4,
        workdir=str(tmp_path / "w"),
    )
    lm_training.train_and_evaluate(config, corpus, log=None)
    lines = []
    path = cli.write_learning_curves(config.run_dir, "valid_ppl", "train_ppl", log=lines.append)
    assert path == tmp_path / "w" / "learning_curves.png" and lines == [f"wrote {path}"]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.write_learning_curves(tmp_path, "valid_ppl", log=lines.append) is None
    assert len(lines) == 1 and not (tmp_path / "learning_curves.png").exists()
