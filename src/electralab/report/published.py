"""The papers' published numbers, as data: `published.csv` beside this module (shipped in the package).

One line per printed number, transcribed from ../shared/papers/ (coco-lm.md, amos.md, teams.md):

    paper,table,setting,group,row,column,value,std
    coco-lm,table3,base,Pretraining Task,RTD Only,MNLI-m,88.4,
    amos,table8,base,Curriculum Setup,w. random layer,CoLA,70.2,1.6

* paper/table: `coco-lm`/`table1`, ... (the keys of electralab.tables.TABLES are `<paper>/<table>`).
* setting: the paper's training setting of the row (`base`, `base++`, `large++`; TEAMS `small`,
  `small++`, `base`, `base++`, `large`). TEAMS Table 4 prints "No Tie" twice, once per setting.
* group: the paper's row group (Table 3 "Pretraining Task", ...), empty where the table has none.
* row: the row name as printed, without markup (`COCO-LM<sub>Base</sub>` -> `COCO-LM Base`).
* column: `MNLI-m` and `MNLI-mm` (the papers print "m/mm" in one cell), `QQP`, `QNLI`, `SST-2`,
  `CoLA`, `RTE`, `MRPC`, `STS-B`, `AVG`, `GLUE` (TEAMS), `SQuAD 1.1 EM/F1`, `SQuAD 2.0 EM/F1`,
  and `Params (M)` (millions: the papers print 110M, 1.3B).
* value: the number exactly as printed (decimals kept: 86.0 stays 86.0); empty where the paper
  prints "—"/"-" (never zero). AMOS Table 2 holds the differences from AMOS Base as printed.
* std: the standard deviation AMOS Tables 8 and 9 print as a subscript; empty elsewhere.
"""

from __future__ import annotations

import functools
from importlib import resources

import pandas as pd

from electralab.errors import ConfigError

KEY = ["paper", "table", "setting", "row", "column"]


@functools.cache
def _load() -> pd.DataFrame:
    with resources.files(__package__).joinpath("published.csv").open("r", encoding="utf-8") as f:
        raw = pd.read_csv(f, dtype=str, keep_default_na=False)
    df = raw.copy()
    df["value"] = pd.to_numeric(raw["value"].replace("", None), errors="raise").astype(float)
    df["std"] = pd.to_numeric(raw["std"].replace("", None), errors="raise").astype(float)
    # Printed precision (TEAMS prints two decimals, the others one): our numbers are shown the same way.
    df["decimals"] = raw["value"].str.partition(".")[2].str.len()
    return df


def published() -> pd.DataFrame:
    """All published numbers (a copy): KEY columns + group, value, std (NaN where not printed), decimals."""
    return _load().copy()


def published_table(paper: str, table: str, setting: str | None = None) -> pd.DataFrame:
    """The lines of one table (and setting), in the paper's order."""
    df = _load()
    sel = (df["paper"] == paper) & (df["table"] == table)
    if setting is not None:
        sel &= df["setting"] == setting
    if not sel.any():
        known = sorted(set(df["paper"] + "/" + df["table"] + " " + df["setting"]))
        raise ConfigError(f"no published numbers for {paper}/{table} setting={setting!r}; known: {', '.join(known)}")
    return df[sel].reset_index(drop=True)


__all__ = ["KEY", "published", "published_table"]
