"""The table registry: every table and figure of the papers that our runs rebuild, each with its rows
(or series) and the run behind each, in the papers' order and naming. It is the one place that says which
run belongs where; everything else is derived from it:

* a run's tables and figures (`tables_of`): the runs' MLflow tag `tables` (electralab.runs),
* the runs a set of tables needs (electralab.runs.runs_for_tables, flows/reproduce.py --tables),
* the report's tables and figures (electralab.report),
* a run's fine-tuning extras (`in_efficiency_figure`, `in_few_shot_figure`; electralab.finetune.protocol).

Adding an ablation row is two edits: its Row (or series point) here and its run in params.yaml `runs:`
(docs/methods.md maps each row to its run and parameter values, and says how to add one).

A table is compared with one of the paper's settings (`setting_for[preset]`): COCO-LM Table 1 under
the tiny/small/base presets is compared with its base-setting rows, under base_pp with base++.
For that setting, `rows[setting]` lists the paper's rows in order as (published row, our run):
run None is a reference-only row (a published baseline we do not train); published None is a row
we train that the paper does not print in that setting (shown with "—" for the paper).

Columns name a fine-tuning task and metric of the MLflow contract (docs/tracking.md): the parent run
of (run, task) logs `median_<metric>`, `std_<metric>`, `min_<metric>`, `max_<metric>`. Task None
with metric "glue_avg" is the GLUE average (COCO-LM Table 1 caption), computed from our medians.

A figure's `series` name its runs: by the x value each stands for (COCO-LM Fig. 4, TEAMS Figs. 4, 5) or by
its label (the others); electralab.report.figures draws them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from electralab.config import PRESETS

GLUE_AVG = "glue_avg"


@dataclass(frozen=True)
class Column:
    name: str  # as in published.csv ("MNLI-m", "SQuAD 2.0 EM", ...)
    task: str | None  # the fine-tuning task (docs/tracking.md); None: computed from the others
    metric: str  # "accuracy", "accuracy_mm", "mcc", "spearman", "exact", "f1", or GLUE_AVG


@dataclass(frozen=True)
class Row:
    published: str | None  # the paper's row name in this setting; None: the paper has no such row
    run: str | None  # our run (params.yaml `runs:`); None: reference only
    label: str | None = None  # shown name when `published` is None

    @property
    def name(self) -> str:
        return self.published or self.label or self.run or "?"


@dataclass(frozen=True)
class TableSpec:
    key: str  # "coco-lm/table3": the runs' `tables` tag
    caption: str  # the paper's caption, shortened
    columns: tuple[Column, ...]
    rows: Mapping[str, tuple[Row, ...]]  # published setting -> rows in the paper's order
    setting_for: Mapping[str, str]  # preset -> the published setting we compare with
    differences_from: str | None = None  # a row name: other rows shown as differences from it (AMOS Table 2)
    # The claims checked (report/claims.py): the paper's method (a run) against every other row we
    # train, these extra (better, worse) run pairs, and every pretrained row against the control.
    subject: str = ""
    claims: tuple[tuple[str, str], ...] = ()
    # The no-pretraining control at the table's budget (the same encoder as its rows), its last row.
    control: str = "control"

    @property
    def paper(self) -> str:
        return self.key.split("/")[0]

    @property
    def table(self) -> str:
        return self.key.split("/")[1]

    @property
    def name(self) -> str:
        """ "COCO-LM Table 3"."""
        return f"{PAPER_TITLES[self.paper]} Table {self.table.removeprefix('table')}"

    def runs(self) -> list[str]:
        """Every run named in any setting (unique, in order)."""
        return list(dict.fromkeys(r.run for rows in self.rows.values() for r in rows if r.run))


PAPER_TITLES = {"coco-lm": "COCO-LM", "amos": "AMOS", "teams": "TEAMS"}


def _all(setting: str) -> dict[str, str]:
    return {preset: setting for preset in PRESETS}


# --- columns ---------------------------------------------------------------------------------------

MNLI_M = Column("MNLI-m", "mnli", "accuracy")
MNLI_MM = Column("MNLI-mm", "mnli", "accuracy_mm")
GLUE_TASKS = (
    MNLI_M,
    MNLI_MM,
    Column("QQP", "qqp", "accuracy"),
    Column("QNLI", "qnli", "accuracy"),
    Column("SST-2", "sst2", "accuracy"),
    Column("CoLA", "cola", "mcc"),
    Column("RTE", "rte", "accuracy"),
    Column("MRPC", "mrpc", "accuracy"),
    Column("STS-B", "stsb", "spearman"),
)
# COCO-LM Table 1 caption: Spearman for STS-B, Matthews for CoLA, accuracy for the rest, the average of
# the eight tasks; MNLI counts once, by its matched accuracy (checked against the printed AVG columns).
GLUE_AVG_PARTS = tuple(c for c in GLUE_TASKS if c is not MNLI_MM)
AVG = Column("AVG", None, GLUE_AVG)
SQUAD2 = (Column("SQuAD 2.0 EM", "squad2", "exact"), Column("SQuAD 2.0 F1", "squad2", "f1"))
# SQuAD 1.1 (TEAMS only): not in the fine-tuning grid yet (docs/tracking.md lists squad2); the cells stay "—".
SQUAD1 = (Column("SQuAD 1.1 EM", "squad1", "exact"), Column("SQuAD 1.1 F1", "squad1", "f1"))
TEAMS_COLUMNS = (Column("GLUE", None, GLUE_AVG), *SQUAD1, *SQUAD2)


# The no-pretraining control (params.yaml runs.control, objectives/none.py): the last row of every table,
# at the table's budget (runs.control_ablation for the ablation tables), so it is the rows' own encoder.
CONTROL_RUN = "control"
ABLATION_CONTROL_RUN = "control_ablation"
CONTROL_RUNS = (CONTROL_RUN, ABLATION_CONTROL_RUN)


def ref(name: str) -> Row:
    return Row(name, None)


def ours(run: str, label: str) -> Row:
    """A row we train that the paper does not print in this setting."""
    return Row(None, run, label)


# --- the tables ------------------------------------------------------------------------------------

COCO_LM_TABLE1 = TableSpec(
    key="coco-lm/table1",
    subject="cocolm",
    claims=(("electra", "mlm"),),
    caption="Results on GLUE and SQuAD 2.0 development set",
    columns=(*GLUE_TASKS, AVG, *SQUAD2),
    setting_for={**_all("base"), "base_pp": "base++", "large_pp": "large++"},
    rows={
        "base": (
            ref("BERT [11]"),
            ref("RoBERTa [31]"),
            ref("XLNet [62]"),
            ref("ELECTRA [7]"),
            ref("MC-BERT [61]"),
            ref("DeBERTa [23]"),
            ref("TUPE [26]"),
            Row("RoBERTa (Ours)", "mlm"),
            Row("ELECTRA (Ours)", "electra"),
            Row("COCO-LM", "cocolm"),
        ),
        "base++": (
            ref("XLNet [62]"),
            ref("RoBERTa [31]"),
            ref("UniLM V2 [1]"),
            ref("DeBERTa [23]"),
            ref("CLEAR [59]"),
            ours("mlm", "RoBERTa (Ours)"),
            ours("electra", "ELECTRA (Ours)"),
            Row("COCO-LM", "cocolm"),
        ),
        "large++": (
            ref("XLNet [62]"),
            ref("RoBERTa [31]"),
            ref("ELECTRA [7]"),
            ref("DeBERTa [23]"),
            Row("COCO-LM", "cocolm"),
            ref("Megatron 1.3B [49]"),
            ref("Megatron 3.9B [49]"),
            ours("mlm", "RoBERTa (Ours)"),
            ours("electra", "ELECTRA (Ours)"),
        ),
    },
)

COCO_LM_TABLE3 = TableSpec(
    key="coco-lm/table3",
    subject="cocolm_ablation",
    caption="Ablations on GLUE Dev. that eliminate (w/o.), keep (Only) or switch (w.) one component",
    columns=(*GLUE_TASKS, AVG),
    setting_for=_all("base"),
    rows={
        "base": (
            Row("COCO-LM Base", "cocolm_ablation"),
            Row("RTD Only", "cocolm_rtd_only"),
            Row("CLM Only", "cocolm_clm_only"),
            Row("SCL + RTD", "cocolm_scl_rtd"),
            Row("w/o. Rel-Pos", "cocolm_no_relpos"),
            Row("w. ELECTRA's Auxiliary", "cocolm_electra_aux"),
            Row("w. Random Replacements", "cocolm_random_replace"),
            Row("w. Converged Auxiliary", "cocolm_converged_aux"),
            Row("All-Token LM Only", "cocolm_all_token_lm"),
            Row("CLM w/o. Copy", "cocolm_no_copy"),
            Row("CLM w/o. Stop-grad", "cocolm_no_stopgrad"),
        )
    },
    control=ABLATION_CONTROL_RUN,
)

AMOS_TABLE1 = TableSpec(
    key="amos/table1",
    subject="amos",
    claims=(("cocolm", "electra"), ("electra", "mlm")),
    caption="Results on GLUE and SQuAD 2.0 development set",
    columns=(*GLUE_TASKS, AVG, *SQUAD2),
    # AMOS has no large setting: large_pp is compared with base++ (same data and steps).
    setting_for={**_all("base"), "base_pp": "base++", "large_pp": "base++"},
    rows={
        # The RoBERTa and ELECTRA rows print the numbers of COCO-LM's RoBERTa (Ours) / ELECTRA (Ours).
        "base": (
            ref("BERT (Devlin et al., 2019)"),
            Row("RoBERTa (Liu et al., 2019)", "mlm"),
            ref("XLNet (Yang et al., 2019)"),
            ref("DeBERTa (He et al., 2021)"),
            ref("TUPE (Ke et al., 2020)"),
            Row("ELECTRA (Clark et al., 2020)", "electra"),
            ref("+HP Loss +Focal (Hao et al., 2021)"),
            ref("MC-BERT (Xu et al., 2020)"),
            Row("COCO-LM (Meng et al., 2021)", "cocolm"),
            Row("AMOS", "amos"),
        ),
        "base++": (
            ref("XLNet (Yang et al., 2019)"),
            ref("RoBERTa (Liu et al., 2019)"),
            ref("UniLM V2 (Bao et al., 2020)"),
            ref("DeBERTa (He et al., 2021)"),
            ref("CLEAR (Wu et al., 2020)"),
            ours("mlm", "RoBERTa (Ours)"),
            ours("electra", "ELECTRA (Ours)"),
            Row("COCO-LM (Meng et al., 2021)", "cocolm"),
            Row("AMOS", "amos"),
        ),
    },
)

_AMOS_ABLATIONS = (
    ("AMOS Base", "amos_ablation"),
    ("w. random layer", "amos_random_layer"),
    ("w. layer switch", "amos_layer_switch"),
    ("- adv. train", "amos_no_adv"),
    ("+ adv. MLM", "amos_adv_mlm"),
    ("w. final mix weights", "amos_final_mix"),  # Table 8 only
    ("- stop grad.", "amos_no_stopgrad"),
    ("w. separate MLM gen.", "amos_separate_gen"),
    ("w. three 4-layer gen.", "amos_three_4layer"),  # Table 8 only
    ("4-layer gen.", "amos_gen4"),
    ("6-layer gen.", "amos_gen6"),
    ("8-layer gen.", "amos_gen8"),
    ("12-layer gen.", "amos_gen12"),
)
_TABLE8_ONLY = {"w. final mix weights", "w. three 4-layer gen."}

AMOS_TABLE2 = TableSpec(
    key="amos/table2",
    subject="amos_ablation",
    caption="Ablations on MNLI/SQuAD 2.0 dev sets; differences (in absolute points) from AMOS Base",
    columns=(MNLI_M, MNLI_MM, *SQUAD2),
    setting_for=_all("base"),
    rows={"base": tuple(Row(name, run) for name, run in _AMOS_ABLATIONS if name not in _TABLE8_ONLY)},
    differences_from="AMOS Base",
    control=ABLATION_CONTROL_RUN,
)

AMOS_TABLE8 = TableSpec(
    key="amos/table8",
    subject="amos_ablation",
    caption="Ablations on the development sets of all GLUE tasks and SQuAD 2.0 (median and std of five seeds)",
    columns=(*GLUE_TASKS, *SQUAD2),
    setting_for=_all("base"),
    rows={"base": tuple(Row(name, run) for name, run in _AMOS_ABLATIONS)},
    control=ABLATION_CONTROL_RUN,
)

AMOS_TABLE9 = TableSpec(
    key="amos/table9",
    subject="amos_ablation",
    caption="Different numbers of MLM heads in the generator (median and std of five seeds)",
    columns=(*GLUE_TASKS, *SQUAD2),
    setting_for=_all("base"),
    rows={
        "base": (
            Row("On (4,6,8) (AMOS)", "amos_ablation"),
            Row("On (4,8)", "amos_exits_4_8"),
            Row("On (2,4,6,8)", "amos_exits_2_4_6_8"),
            Row("On all 8", "amos_exits_all8"),
        )
    },
    control=ABLATION_CONTROL_RUN,
)


def _teams_table1_rows(size: str, public_checkpoint: bool) -> tuple[Row, ...]:
    rows = [Row(f"BERT-{size}", "mlm"), Row(f"ELECTRA-{size} (Our reimplementation)", "electra")]
    if public_checkpoint:  # ELECTRA released Small++, Base++ and Large checkpoints only
        rows.append(ref(f"ELECTRA-{size} (Public checkpoint re-evaluate)"))
    return (*rows, Row(f"TEAMS-{size}", "teams"))


TEAMS_TABLE1 = TableSpec(
    key="teams/table1",
    subject="teams",
    claims=(("electra", "mlm"),),
    caption="TEAMS and baselines on GLUE and SQuAD (medians of 15 fine-tuning runs in the paper)",
    columns=TEAMS_COLUMNS,
    # The small preset is TEAMS-Small's main model (12 x 256); tiny is compared with it too.
    setting_for={"tiny": "small", "small": "small", "base": "base", "base_pp": "base++", "large_pp": "large"},
    rows={
        "small": _teams_table1_rows("Small", False),
        "small++": _teams_table1_rows("Small++", True),
        "base": _teams_table1_rows("Base", False),
        "base++": _teams_table1_rows("Base++", True),
        "large": _teams_table1_rows("Large", True),
    },
)

TEAMS_TABLE2 = TableSpec(
    key="teams/table2",
    subject="teams_ablation",
    claims=(("electra_ablation", "mlm_ablation"),),
    caption="Effectiveness of multi-task pre-training (small++ models in the paper)",
    columns=TEAMS_COLUMNS,
    setting_for=_all("small++"),
    rows={
        "small++": (
            Row("Only MLM (i.e., BERT)", "mlm_ablation"),
            Row("Only RTD (i.e., ELECTRA)", "electra_ablation"),
            Row("Only MWS", "teams_only_mws"),
            Row("RTD + MWS (i.e., TEAMS)", "teams_ablation"),
        )
    },
    control=ABLATION_CONTROL_RUN,
)

TEAMS_TABLE3 = TableSpec(
    key="teams/table3",
    subject="teams_ablation",
    caption="Task-specific layers and exported representations (small++ models in the paper)",
    columns=TEAMS_COLUMNS,
    setting_for=_all("small++"),
    rows={
        "small++": (
            Row("ELECTRA-Small++", "electra_ablation"),
            Row("TEAMS-Small++", "teams_ablation"),
            Row("Use FFN task heads", "teams_ffn_heads"),
            Row("Add task head on 12th layer", "teams_heads_on_top"),
            Row("Use RTD task head outputs", "teams_rtd_outputs"),
        )
    },
    control=ABLATION_CONTROL_RUN,
)

TEAMS_TABLE4 = TableSpec(
    key="teams/table4",
    subject="teams_ablation",
    caption="Sharing generator and discriminator bottom layers (small++ and base++ models in the paper)",
    columns=TEAMS_COLUMNS,
    setting_for={"tiny": "small++", "small": "small++", "base": "base++", "base_pp": "base++", "large_pp": "base++"},
    rows={
        "small++": (
            Row("ELECTRA-Small++", "electra_ablation"),
            Row("TEAMS-Small++", "teams_ablation"),
            Row("Full Tie", "teams_full_tie"),
            Row("No Tie", "teams_no_tie"),
        ),
        "base++": (
            Row("ELECTRA-Base++", "electra_ablation"),
            Row("TEAMS-Base++", "teams_ablation"),
            ours("teams_full_tie", "Full Tie"),
            Row("No Tie", "teams_no_tie"),
        ),
    },
    control=ABLATION_CONTROL_RUN,
)


# --- the figures -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FigureSpec:
    key: str  # "coco-lm/fig4": the runs' `tables` tag, like a table's key
    series: Mapping[str, Mapping[str, Any]]  # series -> {run: the x value it stands for, or its label}
    subject: str | None = None  # the paper's method, drawn as a curve against the series
    reference: str | None = None  # a run drawn as a reference line
    # What the figure's runs are fine-tuned on besides the main grid (electralab.finetune.protocol):
    efficiency: bool = False  # finetune.efficiency_tasks on each pretraining fraction checkpoint
    few_shot: bool = False  # finetune.few_shot_tasks on each of finetune.few_shot_fractions of the labels

    @property
    def paper(self) -> str:
        return self.key.split("/")[0]

    def runs(self) -> list[str]:
        """Every run the figure draws (unique, in order)."""
        named = [self.subject, *(run for runs in self.series.values() for run in runs), self.reference]
        return list(dict.fromkeys(run for run in named if run))


COCO_LM_FIG3 = FigureSpec(  # MNLI dev accuracy against pretraining hours; the baselines' end points marked
    key="coco-lm/fig3",
    subject="cocolm",
    series={"end points": {"mlm": "RoBERTa (Ours)", "electra": "ELECTRA (Ours)"}},
    efficiency=True,
)

COCO_LM_FIG4 = FigureSpec(  # GLUE dev results against the crop fraction (% of X^orig kept; 100: no cropping)
    key="coco-lm/fig4",
    series={"COCO-LM": {"cocolm_crop70": 70, "cocolm_crop80": 80, "cocolm_ablation": 90, "cocolm_crop100": 100}},
)

COCO_LM_FIG7 = FigureSpec(  # (a, b) [CLS] cosine of SCL pairs, a panel per run; (c, d) few-shot MNLI
    key="coco-lm/fig7",
    series={"SCL": {"cocolm_ablation": "(a) with SCL", "cocolm_clm_only": "(b) without SCL"}},
    few_shot=True,
)

COCO_LM_FIG8 = FigureSpec(  # copy and LM accuracy on replaced and original tokens
    key="coco-lm/fig8",
    series={"LM": {"cocolm_ablation": "CLM", "cocolm_all_token_lm": "All-Token MLM"}},
)

AMOS_FIG3 = FigureSpec(  # (a) the mixture weight of each exit; (b) RTD accuracy on replaced tokens
    key="amos/fig3",
    series={
        "mixture": {"amos_ablation": "(a) mixture weights"},
        "curriculum": {
            "amos_ablation": "AMOS",
            "amos_gen4": "4-layer gen.",
            "amos_gen8": "8-layer gen.",
            "amos_random_layer": "Random Layer",
            "amos_layer_switch": "Layer Switch",
        },
    },
)

AMOS_FIG4 = FigureSpec(  # MNLI dev accuracy against pretraining hours; the baselines' end points marked
    key="amos/fig4",
    subject="amos",
    series={"end points": {"cocolm": "COCO-LM", "electra": "ELECTRA", "mlm": "RoBERTa"}},
    efficiency=True,
)

TEAMS_FIG4 = FigureSpec(  # results against the number of generator layers (6 is TEAMS; bottom half tied)
    key="teams/fig4",
    series={
        "TEAMS": {
            "teams_gen2": 2,
            "teams_gen4": 4,
            "teams_ablation": 6,
            "teams_gen8": 8,
            "teams_gen10": 10,
            "teams_gen12": 12,
        }
    },
)

TEAMS_FIG5 = FigureSpec(  # "sampled" vs "hardest" negatives against K; ELECTRA as a reference line
    key="teams/fig5",
    series={
        "Sampled": {
            "teams_sampled_k1": 1,
            "teams_sampled_k3": 3,
            "teams_ablation": 5,
            "teams_sampled_k10": 10,
            "teams_sampled_k50": 50,
        },
        "Hardest": {
            "teams_hardest_k1": 1,
            "teams_hardest_k3": 3,
            "teams_hardest_k5": 5,
            "teams_hardest_k10": 10,
            "teams_hardest_k50": 50,
        },
    },
    reference="electra_ablation",
)


# --- the registry ----------------------------------------------------------------------------------


def with_control(spec: TableSpec) -> TableSpec:
    control = Row(None, spec.control, "No pretraining (control)")
    return dataclasses.replace(spec, rows={setting: (*rows, control) for setting, rows in spec.rows.items()})


TABLES: dict[str, TableSpec] = {
    spec.key: with_control(spec)
    for spec in (
        COCO_LM_TABLE1,
        COCO_LM_TABLE3,
        AMOS_TABLE1,
        AMOS_TABLE2,
        AMOS_TABLE8,
        AMOS_TABLE9,
        TEAMS_TABLE1,
        TEAMS_TABLE2,
        TEAMS_TABLE3,
        TEAMS_TABLE4,
    )
}

FIGURES: dict[str, FigureSpec] = {
    spec.key: spec
    for spec in (COCO_LM_FIG3, COCO_LM_FIG4, COCO_LM_FIG7, COCO_LM_FIG8, AMOS_FIG3, AMOS_FIG4, TEAMS_FIG4, TEAMS_FIG5)
}

# Every table and figure, paper by paper, its tables before its figures: the order of a run's `tables` tag.
REGISTRY: dict[str, TableSpec | FigureSpec] = {
    key: entry for paper in PAPER_TITLES for key, entry in (TABLES | FIGURES).items() if entry.paper == paper
}


# The functions below read REGISTRY when called (not a copy made at import), so that a test can put a run
# into a figure with monkeypatch.setitem.


# The headline comparison: the three papers' Table 1 (`make repro`: the Makefile's HEADLINE names the same, a test
# checks it), whose rows the report's headline figure draws.
HEADLINE = ("coco-lm/table1", "amos/table1", "teams/table1")


def tables_of(run: str) -> tuple[str, ...]:
    """The tables and figures `run` is in, in REGISTRY order (its MLflow tag `tables`)."""
    return tuple(key for key, entry in REGISTRY.items() if run in entry.runs())


def in_efficiency_figure(run: str) -> bool:
    """Whether `run` also fine-tunes efficiency_tasks on its pretraining fraction checkpoints."""
    return any(isinstance(e, FigureSpec) and e.efficiency and run in e.runs() for e in REGISTRY.values())


def in_few_shot_figure(run: str) -> bool:
    """Whether `run` also fine-tunes few_shot_tasks on fractions of its labels."""
    return any(isinstance(e, FigureSpec) and e.few_shot and run in e.runs() for e in REGISTRY.values())


__all__ = [
    "AVG",
    "ABLATION_CONTROL_RUN",
    "CONTROL_RUN",
    "CONTROL_RUNS",
    "Column",
    "FIGURES",
    "FigureSpec",
    "GLUE_AVG",
    "GLUE_AVG_PARTS",
    "HEADLINE",
    "GLUE_TASKS",
    "REGISTRY",
    "Row",
    "SQUAD1",
    "SQUAD2",
    "TABLES",
    "TableSpec",
    "in_efficiency_figure",
    "in_few_shot_figure",
    "tables_of",
]
