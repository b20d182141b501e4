"""Configuration: the real params.yaml loads, and bad data settings stop with the key, value and range."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import yaml
from conftest import ROOT

from electralab.config import MaskingConfig, build, load_params, parse_params
from electralab.errors import ConfigError


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))


def with_change(raw: dict, dotted: str, value) -> dict:
    out = copy.deepcopy(raw)
    *path, last = dotted.split(".")
    node = out
    for key in path:
        node = node.setdefault(key, {})  # a key the preset leaves to the code default
    node[last] = value
    return out


def test_params_yaml_loads_every_preset():
    params = load_params(ROOT / "params.yaml")
    assert params.preset == "tiny"
    tiny = params.active
    assert [m.file for m in tiny.corpus.mirror] == ["enwiki_featured_articles.txt", "enwiki_good_articles_sample.txt"]
    assert tiny.corpus.mirror[0].format == "paragraphs" and tiny.corpus.max_documents is None
    assert (tiny.vocab.size, tiny.shards.seq_len) == (8192, 128)
    assert tiny.pretrain.guard.enabled and tiny.pretrain.dropout == 0.0 and tiny.pretrain.precision == "auto"
    assert params.presets["base"].vocab.size == 32768 and params.presets["base"].corpus.uncased
    assert params.presets["base_pp"].vocab.size == 64000 and not params.presets["base_pp"].corpus.uncased


@pytest.mark.parametrize(
    "dotted, value, expected",
    [
        ("presets.tiny.shards.seq_len", 8, "presets.tiny.shards.seq_len=8 is out of range: allowed [16, 8192]"),
        ("presets.tiny.shards.seq_len", 100000, "presets.tiny.shards.seq_len=100000 is out of range"),
        ("presets.tiny.shards.seq_len", "long", "presets.tiny.shards.seq_len: expected an integer, got 'long'"),
        ("presets.tiny.shards.validation_fraction", 0.9, "presets.tiny.shards.validation_fraction=0.9 is out of range"),
        ("presets.tiny.shards.workers", 0, "presets.tiny.shards.workers=0 is out of range"),
        ("presets.tiny.vocab.size", 10, "presets.tiny.vocab.size=10 is out of range: allowed [64, 1000000]"),
        ("presets.tiny.vocab.input_sentence_size", 5, "presets.tiny.vocab.input_sentence_size=5 is out of range"),
        ("presets.tiny.vocab.model_type", "wordpiece", "presets.tiny.vocab.model_type: 'wordpiece' is not allowed"),
        ("presets.tiny.corpus.max_documents", 0, "presets.tiny.corpus.max_documents=0 is out of range"),
        (
            "presets.tiny.corpus.mirror",
            [{"file": "x.txt", "format": "csv"}],
            "presets.tiny.corpus.mirror[0].format: 'csv' is not allowed; choose one of ['paragraphs', 'wikitext']",
        ),
        ("presets.tiny.corpus.sources", [], "presets.tiny.corpus: unknown key 'sources'"),
        (
            "presets.tiny.shards.static_masking.duplication",
            -1,
            "presets.tiny.shards.static_masking.duplication=-1 is out of range",
        ),
        (
            "presets.tiny.pretrain.adam_betas",
            [1.5, 2.0],
            "presets.tiny.pretrain.adam_betas=[1.5, 2.0]: betas must be in [0, 1)",
        ),
        (
            "presets.tiny.pretrain.checkpoint_fractions",
            [1.5, -1],
            "presets.tiny.pretrain.checkpoint_fractions=[1.5, -1.0]: fractions of training must be in (0, 1]",
        ),
        ("presets.tiny.pretrain.checkpoint_fractions", [0.5, 0.5], "checkpoint_fractions=[0.5, 0.5] repeats a value"),
        (
            "presets.tiny.generators.teams",
            {"layers": 2, "hidden": 64},
            "presets.tiny.generators.teams: set only `layers`: TEAMS's generator shares the discriminator's",
        ),
        (
            "presets.tiny.finetune.task_epochs",
            {"sts": [10]},
            "presets.tiny.finetune.task_epochs: 'sts' is not a task; choose from",
        ),
        (
            "presets.tiny.finetune.task_epochs",
            {"stsb": [0]},
            "presets.tiny.finetune.task_epochs.stsb=[0]: list one or more distinct epoch counts, each >= 1",
        ),
    ],
)
def test_bad_data_settings_name_key_and_value(raw, dotted, value, expected):
    with pytest.raises(ConfigError) as e:
        parse_params(with_change(raw, dotted, value))
    assert expected in str(e.value)


def test_seq_len_beyond_model_positions(raw):
    with pytest.raises(
        ConfigError, match=r"presets.tiny.shards.seq_len=1024 exceeds presets.tiny.model.max_positions=512"
    ):
        parse_params(with_change(raw, "presets.tiny.shards.seq_len", 1024))


def test_masking_probabilities_must_leave_room():
    with pytest.raises(ConfigError, match=r"masking: mask_token_prob \+ random_token_prob = 1.1 exceeds 1"):
        build(MaskingConfig, {"mask_token_prob": 0.9, "random_token_prob": 0.2}, "masking")
    electra = build(MaskingConfig, {"mask_token_prob": 0.85, "random_token_prob": 0.0}, "masking")
    assert electra.mask_prob == 0.15


def test_a_runs_budget_picks_its_scale_and_every_table_compares_at_one_budget():
    from electralab.runs import resolve_all
    from electralab.tables import TABLES

    params = load_params(ROOT / "params.yaml")
    runs, tiny = resolve_all(params), params.active
    ablation = tiny.budgets["ablation"]
    assert (runs["cocolm"].pretrain, runs["cocolm"].model, runs["cocolm"].generators) == (
        tiny.pretrain,
        tiny.model,
        tiny.generators,
    )
    # the ablation budget's own schedule, model and auxiliaries: the papers' depths, a shorter schedule
    assert runs["cocolm_ablation"].pretrain.steps == ablation["pretrain"]["steps"] < tiny.pretrain.steps
    assert runs["cocolm_ablation"].model.layers == 12 > tiny.model.layers == 4
    assert runs["amos_ablation"].generators.amos.exits == (4, 6, 8) and tiny.generators.amos.exits == (1, 2, 3)
    assert runs["cocolm_rtd_only"].pretrain == runs["cocolm_ablation"].pretrain
    # nested changes merge key by key: what the budget does not state is the preset's
    guard, model = runs["cocolm_ablation"].pretrain.guard, runs["cocolm_ablation"].model
    assert guard.every == ablation["pretrain"]["guard"]["every"] and guard.batches == tiny.pretrain.guard.batches
    assert model.detector_bias == tiny.model.detector_bias == "base_rate"
    assert model.same_piece_init == tiny.model.same_piece_init == 4.0  # the preset's prior, every budget alike
    # the run's own: without the relative bias the prior (which lives in it) is off too
    assert runs["cocolm_no_relpos"].model == dataclasses.replace(model, relative_positions=False, same_piece_init=None)
    for key, spec in TABLES.items():  # the control included: the same encoder as the table's rows
        budgets = {runs[r].spec.budget for r in spec.runs()}
        assert len(budgets) == 1, (key, budgets)
        assert {runs[r].model.layers for r in spec.runs()} == {runs[spec.control].model.layers}, key
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    with pytest.raises(ConfigError, match=r"runs.cocolm_rtd_only.budget='ablaton' is not a budget of any preset"):
        resolve_all(parse_params(with_change(raw, "runs.cocolm_rtd_only.budget", "ablaton")))
    with pytest.raises(ConfigError, match=r"presets.tiny.budgets.ablation.pretrain.steps=0 is out of range"):
        parse_params(with_change(raw, "presets.tiny.budgets.ablation.pretrain.steps", 0))
    with pytest.raises(ConfigError, match=r"presets.tiny.budgets.ablation.model: unknown key 'layerz'"):
        parse_params(with_change(raw, "presets.tiny.budgets.ablation.model.layerz", 3))
    with pytest.raises(ConfigError, match=r"presets.tiny.budgets.ablation: unknown key 'steps'.*pretrain"):
        parse_params(with_change(raw, "presets.tiny.budgets.ablation.steps", 700))  # the schema before 25 Nov
    with pytest.raises(ConfigError, match=r"presets.tiny.budgets.ablation.generators.amos.exits=\[4, 6, 8\]"):
        parse_params(with_change(raw, "presets.tiny.budgets.ablation.generators.amos.layers", 6))


@pytest.mark.parametrize("section, key", [("pretrain", "steps"), ("vocab", "size"), ("model", "layers")])
def test_a_preset_without_a_scale_key_is_refused_not_given_the_base_default(raw, section, key):
    broken = copy.deepcopy(raw)
    del broken["presets"]["small"][section][key]  # not the active preset: every preset is checked
    with pytest.raises(ConfigError, match=rf"presets\.small\.{section}\.{key}: missing; every preset sets it"):
        parse_params(broken)


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    lines = (ROOT / "params.yaml").read_text(encoding="utf-8").splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("      steps: "))  # the tiny preset's
    lines.insert(at + 1, "      steps: 7   # pasted twice")
    path = tmp_path / "params.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(
        ConfigError,
        match=rf"params\.yaml: key 'steps' appears twice in one mapping "
        rf"\(lines {at + 1} and {at + 2}\); keep one",
    ):
        load_params(path)


def test_runs_that_read_each_other_are_a_cycle_not_a_recursion(raw):
    from electralab.runs import resolve_all

    looped = copy.deepcopy(raw)
    looped["runs"]["mlm"]["reads"] = "models/electra"
    looped["runs"]["electra"]["reads"] = "models/mlm/encoder"
    with pytest.raises(
        ConfigError,
        match=r"runs\.mlm\.reads: the runs read each other's output in a cycle "
        r"\(mlm -> electra -> mlm\)",
    ):
        resolve_all(parse_params(looped))


def test_another_pretraining_seed_of_a_row_trains_as_its_run_does_and_goes_where_it_goes(raw):
    from electralab.runs import resolve_all, runs_for_tables

    seeded = copy.deepcopy(raw)
    assert seeded["runs"]["electra_seed2"] == {
        "method": "electra",
        "reads": "data/shards",
        "seed": 2,
        "seed_of": "electra",
        "description": "ELECTRA, pretraining seed 2",
    }
    params = parse_params(seeded)
    runs = resolve_all(params)
    again, electra = runs["electra_seed2"], runs["electra"]
    assert (again.row, again.seed, electra.seed) == ("electra", 2, 1)
    assert again.tables == ("coco-lm/table1", "amos/table1", "teams/table1")  # electra's tables, not its figures
    assert "electra_seed2" in runs_for_tables(params, ["coco-lm/table1"])
    assert "electra_seed2" not in runs_for_tables(params, ["coco-lm/table3"])
    assert "electra_seed2" not in runs_for_tables(params, ["coco-lm/fig3"])  # electra's efficiency figure

    def refused(change: dict, message: str) -> None:
        bad = copy.deepcopy(seeded)
        bad["runs"]["electra_seed2"] |= change
        with pytest.raises(ConfigError, match=message):
            resolve_all(parse_params(bad))

    refused({"seed_of": "electra_typo"}, r"runs\.electra_seed2\.seed_of='electra_typo' is not a run of the registry")
    refused(
        {"settings": {"rtd_weight": 10.0}}, r"runs\.electra_seed2: another pretraining seed of 'electra' .* settings"
    )
    refused({"budget": "ablation"}, r"runs\.electra_seed2: another pretraining seed of 'electra' .* budget differs")
    refused(
        {"seed": 1}, r"runs\.electra_seed2\.seed=1: 'electra' already pretrains 'electra' with that seed \(the preset's"
    )
    refused({"seed": 3}, r"runs\.electra_seed3\.seed=3: 'electra_seed2' already pretrains 'electra' with that seed$")
    refused({"seed_of": "electra_seed2"}, r"is not a run of the registry that is not itself another's seed")


def test_each_methods_masking_default_is_its_papers_and_params_yaml_departs_from_none():
    # docs/methods.md "Masking": ELECTRA's release and TEAMS (BERT's data pipeline) never mask [CLS]/[SEP];
    # RoBERTa-style MLM, COCO-LM (App. D) and AMOS (the same fairseq code) do.
    from electralab.objectives import method_settings

    expected = {
        "mlm": (0.8, 0.1, True),
        "electra": (0.85, 0.0, False),
        "cocolm": (0.8, 0.1, True),
        "amos": (0.8, 0.1, True),
        "teams": (0.8, 0.1, False),
    }
    params = load_params(ROOT / "params.yaml")
    for method, (mask_token, random_token, specials) in expected.items():
        masking = method_settings(method, {}).masking
        assert (masking.mask_prob, masking.mask_token_prob, masking.random_token_prob, masking.mask_special_tokens) == (
            0.15,
            mask_token,
            random_token,
            specials,
        ), method
        assert params.methods[method] == {}, f"methods.{method}: params.yaml departs from the paper"


def test_config_module_prints_a_resolved_preset(capsys):
    from electralab.config import main

    main(["small", "--params", str(ROOT / "params.yaml")])
    printed = yaml.safe_load(capsys.readouterr().out)["small"]
    assert printed["pretrain"]["precision"] == "auto"  # a code default, not in params.yaml
    assert printed["finetune"]["grids"]["glue_small"]["lr"] == [1.0e-4, 3.0e-4]  # the preset's own
    with pytest.raises(SystemExit, match="no preset 'nope'"):
        main(["nope", "--params", str(ROOT / "params.yaml")])


def test_a_relative_data_mirror_is_the_projects_under_dvc_also_in_a_temporary_experiments_copy(tmp_path, monkeypatch):
    # `dvc exp run --temp` runs each stage in a copy of the project elsewhere, with DVC_ROOT at the project itself:
    # ELECTRALAB_DATA=../shared/data must name the mirror beside the project, not beside the copy.
    from electralab.env import data_root

    project, mirror, copy = (
        tmp_path / "work" / "project",
        tmp_path / "work" / "shared" / "data",
        tmp_path / "tmp" / "exp",
    )
    for d in (project, mirror, copy):
        d.mkdir(parents=True)
    monkeypatch.setenv("ELECTRALAB_DATA", "../shared/data")
    monkeypatch.chdir(copy)
    monkeypatch.setenv("DVC_ROOT", str(project))
    assert data_root() == mirror.resolve()
    monkeypatch.delenv("DVC_ROOT")
    monkeypatch.chdir(project)  # `make` from the project root: the current directory
    assert data_root() == mirror.resolve()
    monkeypatch.setenv("ELECTRALAB_DATA", str(mirror))  # an absolute value is itself wherever it runs
    monkeypatch.chdir(copy)
    assert data_root() == mirror.resolve()
    monkeypatch.setenv("ELECTRALAB_DATA", "../nowhere")
    with pytest.raises(ConfigError, match=r"ELECTRALAB_DATA='../nowhere'"):
        data_root()


def test_params_yaml_is_in_the_layout_dvc_writes_so_one_set_changes_one_line(tmp_path):
    """`dvc exp run -S key=value` rewrites params.yaml through DVC's own YAML round trip: in that layout already,
    the file changes in the one line set (not in every flow mapping DVC would wrap and every string it requotes).
    After editing params.yaml by hand, restore the layout with the round trip below."""
    from dvc.utils.serialize import modify_yaml

    copy_ = tmp_path / "params.yaml"
    copy_.write_bytes((ROOT / "params.yaml").read_bytes())
    with modify_yaml(copy_) as data:
        data["presets"]["tiny"]["pretrain"]["steps"] = 500
    before = (ROOT / "params.yaml").read_text(encoding="utf-8").splitlines()
    after = copy_.read_text(encoding="utf-8").splitlines()
    assert len(before) == len(after)
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(changed) == 1 and "steps: 500" in changed[0][1], changed[:5]


def test_the_first_look_changes_the_presets_fine_tuning_without_the_figures_extras():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    tiny = parse_params(raw).active
    first = tiny.first_look_finetune()
    assert first.tasks == tuple(raw["presets"]["tiny"]["first_look"]["tasks"]) and first.seeds == tiny.finetune.seeds
    assert first.efficiency_tasks == first.few_shot_tasks == ()  # the figures' extras are off
    assert first.task_epochs == tiny.finetune.task_epochs and first.grids == tiny.finetune.grids  # the rest as is
    with pytest.raises(ConfigError, match=r"presets.tiny.first_look: unknown key 'taks'"):
        parse_params(with_change(raw, "presets.tiny.first_look.taks", ["stsb"]))
    with pytest.raises(ConfigError, match=r"presets.tiny.first_look.tasks: 'sts' is not a task"):
        parse_params(with_change(raw, "presets.tiny.first_look.tasks", ["sts"]))
    with pytest.raises(ConfigError, match=r"presets.small.first_look: this preset has no first look"):
        parse_params({**raw, "preset": "small"}).active.first_look_finetune("presets.small.first_look")
