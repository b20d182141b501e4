"""Tables as Markdown, CSV and HTML, and the one self-contained HTML page (figures embedded as PNG).

A cell reads `ours ±std / published (ours − published)`: our median over the fine-tuning seeds and its
standard deviation, the paper's number, and the difference. "—" marks a value that does not exist
(a run not trained yet, a task not fine-tuned, a number the paper does not print) — never a zero.

The page is compact by default: `ours / published` per cell, an empty cell numbered to a footnote that says
why (the frame's `why` column, report/why.py), and the detailed table (spread, range, difference) one click
away. A cell is coloured by its claim verdict when the frame carries one (a `verdict` column, e.g. "holds",
"reversed", "within noise"; a `row_verdict` column colours the row's name); the CSV keeps every number.
"""

from __future__ import annotations

import base64
import html
import math
import re
from pathlib import Path

import pandas as pd

from electralab.report.build import BuiltTable

LEGEND = (
    "Cell: our median ±std over the fine-tuning seeds / the published value (ours − published); "
    "— = not available; failed = fine-tuned, but the model diverged (no number). Reference rows "
    '(run "reference") are published baselines we do not train.'
)
COMPACT_LEGEND = (
    "Cell: our median over the fine-tuning seeds / the published value; — = not available, its "
    "footnote under the table says why; failed = fine-tuned, but the model diverged (no number); "
    'reference rows (run "reference") show the published '
    "baselines we do not train. Each table's details give the spread, range and difference; every "
    "number is in tables/*.csv."
)
VERDICT_LEGEND = (
    "A row's name is coloured by the verdict of the table's claim about it (the table's method against "
    "that row; the method's own row: against the no-pretraining control): green holds, red reversed, "
    "grey within noise; its claims are under the table."
)


def number(x: float, decimals: int, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:+.{decimals}f}" if sign else f"{x:.{decimals}f}"


def _is_difference(table: BuiltTable, row: str) -> bool:
    return bool(table.spec.differences_from) and row != table.spec.differences_from


def cell_text(line: pd.Series, decimals: int, difference: bool = False) -> str:
    # failed: every configuration's median was not a number (the model diverged), which is not "not run"
    ours = "failed" if line.get("failed", False) else number(line["ours"], decimals, sign=difference)
    if not math.isnan(line["std"]):
        ours += f" ±{number(line['std'], decimals)}"
    published = number(line["published"], decimals, sign=difference)
    text = f"{ours} / {published}"
    if not math.isnan(line["diff"]):
        text += f" ({number(line['diff'], decimals, sign=True)})"
    return text


def _rows(table: BuiltTable):
    """(group, row, run, lines of its cells in column order), in the spec's order."""
    frame = table.frame
    for row in dict.fromkeys(frame["row"]):
        lines = frame[frame["row"] == row]
        yield lines["group"].iloc[0], row, lines["run"].iloc[0] or "reference", lines


def to_markdown(table: BuiltTable, note: str = "") -> str:
    columns = list(dict.fromkeys(table.frame["column"]))
    has_groups = (table.frame["group"] != "").any()
    head = (["Group"] if has_groups else []) + ["Row", "Run"] + columns
    out = [f"### {table.title}", ""]
    if note:
        out += [f"Data: {note}", ""]
    out += [LEGEND, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for group, row, run, lines in _rows(table):
        cells = [cell_text(line, table.decimals, _is_difference(table, row)) for _, line in lines.iterrows()]
        first = ([group] if has_groups else []) + [row, f"`{run}`" if run != "reference" else run]
        out.append("| " + " | ".join([*(c.replace("|", "\\|") for c in first), *cells]) + " |")
    return "\n".join(out) + "\n"


def to_csv(table: BuiltTable, path: str | Path) -> None:
    """The table's long form: one line per (row, column) with every number unrounded; NaN as empty."""
    table.frame.to_csv(path, index=False, float_format="%.6g")


# --- HTML --------------------------------------------------------------------------------------------

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em 2em; color: #222; max-width: 1500px; }
table { border-collapse: collapse; margin: 0.5em 0 0.5em; font-size: 12px; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; vertical-align: top; }
th { background: #f2f2f2; } td.name { text-align: left; white-space: nowrap; }
td.group { white-space: normal; min-width: 7em; max-width: 14em; }
td.num { white-space: nowrap; }
tr.reference td { color: #777; background: #fafafa; }
.ours { font-weight: 600; } .spread, .pub { color: #666; font-size: 11px; }
.pos { color: #1a7f37; } .neg { color: #c62828; } .note { color: #555; font-size: 13px; }
sup.why { color: #8a6d00; font-weight: 600; }
ol.why { color: #555; font-size: 12px; margin: 0.2em 0 0.5em; padding-left: 2em; }
details { margin: 0 0 2em; } summary { cursor: pointer; color: #1a5fb4; font-size: 13px; }
nav { font-size: 13px; line-height: 1.6; }
.verdict-holds { background: #e6f4ea; } .verdict-reversed { background: #fde7e9; }
.verdict-within-noise { background: #f1f1f1; }
img { max-width: 100%; border: 1px solid #eee; margin-bottom: 1.5em; }
"""


def _html_cell(line: pd.Series, decimals: int, difference: bool) -> str:
    e = html.escape
    ours = f'<span class="ours">{e(number(line["ours"], decimals, sign=difference))}</span>'
    if not math.isnan(line["std"]):
        ours += (
            f'<br><span class="spread">±{number(line["std"], decimals)} '
            f"[{number(line['min'], decimals, sign=difference)}, "
            f"{number(line['max'], decimals, sign=difference)}]</span>"
        )
    pub = f'<br><span class="pub">paper {e(number(line["published"], decimals, sign=difference))}'
    if not math.isnan(line["diff"]):
        css = "pos" if line["diff"] >= 0 else "neg"
        pub += f' <span class="{css}">({number(line["diff"], decimals, sign=True)})</span>'
    return f"<td>{ours}{pub}</span></td>"


def _field(line: pd.Series, name: str) -> str:
    """An optional text column of the frame (`why`, `verdict`, `row_verdict`): "" when absent or empty."""
    value = line.get(name, "")
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def verdict_class(verdict: str) -> str:
    """ "within noise" -> "verdict-within-noise" (a CSS class; "" for no verdict)."""
    return f"verdict-{re.sub(r'[^a-z0-9]+', '-', verdict.lower()).strip('-')}" if verdict else ""


def _compact_cell(line: pd.Series, decimals: int, difference: bool, footnotes: dict[str, int] | None) -> str:
    """`ours / published`, the empty side footnoted with why, coloured by the verdict if there is one."""
    e = html.escape
    ours = number(line["ours"], decimals, sign=difference)
    why = _field(line, "why")
    text = f'<span class="ours">{e(ours)}</span>'
    if footnotes is None:  # a reference row: the paper's number only
        return f'<td class="num">{e(number(line["published"], decimals, sign=difference))}</td>'
    if ours == "—" and why:
        number_ = footnotes.setdefault(why, len(footnotes) + 1)
        text += f'<sup class="why" title="{e(why)}">{number_}</sup>'
    text += f' <span class="pub">/ {e(number(line["published"], decimals, sign=difference))}</span>'
    css = " ".join(c for c in ("num", verdict_class(_field(line, "verdict"))) if c)
    return f'<td class="{css}">{text}</td>'


def _detailed_table(table: BuiltTable, head: list[str], has_groups: bool) -> list[str]:
    e = html.escape
    out = ["<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"]
    for group, row, run, lines in _rows(table):
        css = ' class="reference"' if run == "reference" else ""
        names = ([group] if has_groups else []) + [row, run]
        cells = "".join(_html_cell(line, table.decimals, _is_difference(table, row)) for _, line in lines.iterrows())
        out.append(f"<tr{css}>" + "".join(f'<td class="name">{e(n)}</td>' for n in names) + cells + "</tr>")
    return out + ["</table>"]


def table_html(table: BuiltTable, note: str = "") -> str:
    """The compact table, the footnotes of its empty cells, and the detailed table behind a <details>."""
    e = html.escape
    columns = list(dict.fromkeys(table.frame["column"]))
    has_groups = (table.frame["group"] != "").any()
    anchor = table.spec.key.replace("/", "-")
    out = [f'<h3 id="{anchor}">{e(table.title)}</h3>']
    if note:
        out.append(f'<p class="note">Data: {e(note)}</p>')
    head = (["Group"] if has_groups else []) + ["Row", "Run"] + columns
    out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
    footnotes: dict[str, int] = {}
    for group, row, run, lines in _rows(table):
        css = ' class="reference"' if run == "reference" else ""
        row_css = verdict_class(_field(lines.iloc[0], "row_verdict"))
        names = ([f'<td class="name group">{e(group)}</td>'] if has_groups else []) + [
            f'<td class="name {row_css}">{e(n)}</td>' for n in (row, run)
        ]
        notes = None if run == "reference" else footnotes
        cells = "".join(
            _compact_cell(line, table.decimals, _is_difference(table, row), notes) for _, line in lines.iterrows()
        )
        out.append(f"<tr{css}>" + "".join(names) + cells + "</tr>")
    out.append("</table>")
    if footnotes:
        out.append('<ol class="why">' + "".join(f"<li>{e(why)}</li>" for why in footnotes) + "</ol>")
    out.append(
        f"<details><summary>Spread, range and difference (every number: "
        f"tables/{e(table.spec.key.replace('/', '_'))}.csv)</summary>"
    )
    out += _detailed_table(table, head, has_groups)
    out.append("</details>")
    return "\n".join(out)


def page_html(title: str, intro: list[str], tables: list[str], figures: dict[str, Path], notes: list[str] = ()) -> str:
    """One self-contained page: links to every table and figure, the tables, then every figure inlined as a
    base64 PNG (`notes`: what the figures leave out and why)."""
    e = html.escape
    parts = [
        "<!doctype html>",
        '<html><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{e(title)}</h1>",
    ]
    parts += [f'<p class="note">{e(p)}</p>' for p in intro]
    keys = re.findall(r'<h3 id="([^"]+)">', "".join(tables))
    links = " · ".join(f'<a href="#{k}">{e(k)}</a>' for k in keys + [k.replace("/", "-") for k in figures])
    legend = COMPACT_LEGEND + (" " + VERDICT_LEGEND if re.search(r'<td class="[^"]*verdict-', "".join(tables)) else "")
    parts += [
        f"<nav>{links}</nav>",
        f'<p class="note">{e(legend)}</p>',
        "<h2>Tables</h2>",
        *tables,
        "<h2>Figures</h2>",
        *(f'<p class="note">{e(n)}</p>' for n in notes),
    ]
    for key, path in figures.items():
        data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
        parts.append(
            f'<h3 id="{e(key.replace("/", "-"))}">{e(key)}</h3><img alt="{e(key)}" src="data:image/png;base64,{data}">'
        )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# --- the claims checked (report/claims.py) --------------------------------------------------------------

CLAIMS_LEGEND = (
    "Claims: ours = difference of the two rows' median per-seed scores (mean over the tasks listed) "
    "± the pooled seed std; paper = the same difference in the paper; verdict by Welch's two-sided "
    "t-test on the per-seed scores, alpha 0.05 (holds / reversed: significant with the paper's sign "
    "or against it; within noise: not significant); where a row stands on several pretraining runs, its "
    "score is the median of theirs and the test's unit is the run (its mean over the seeds), so the spread "
    "holds the pretraining seeds' noise too. Against the control the premise is that pretraining helps."
)
EQUAL_COMPUTE_LEGEND = (
    "At equal compute: the faster row's finished run against the slower row's latest fine-tuned checkpoint that "
    "had used no more device-hours, on the tasks both have (fine-tuning seeds as the units); the verdict as above."
)


WITHOUT_LARGEST_LEGEND = (
    "Without its largest task: the claim tested again without the task whose own difference supports its sign most "
    "(that task and its difference in brackets); a claim that holds only with it is that one task's."
)


def _claim_cells(line: pd.Series, extras: list) -> list[str]:
    ours = number(line["ours"], 2, sign=True)
    if not math.isnan(line["spread"]):
        ours += f" ±{number(line['spread'], 2)}"
    cells = [
        line["claim"],
        ours,
        number(line["published"], 2, sign=True),
        number(line["p_value"], 3),
        str(line["verdict"]),
        f"{line['tasks']} ({line['seeds']} seeds{pretraining(line)})" if line["tasks"] else "—",
    ]
    return [*cells, *(extra(line) for extra in extras)]


def without_largest(line: pd.Series) -> str:
    """The claim without its largest task in words: "within noise, -1.09 (p 0.120; STS-B +60.33 left out)", or "—"."""
    if not math.isfinite(line["without_ours"]):
        return "—"
    ours, p_value = number(line["without_ours"], 2, sign=True), number(line["without_p_value"], 3)
    left_out = f"{line['largest_task']} {number(line['largest_task_ours'], 2, sign=True)} left out"
    return f"{line['without_verdict']}, {ours} (p {p_value}; {left_out})"


def equal_compute(line: pd.Series) -> str:
    """The claim at equal compute in words: "reversed, -5.10 (cocolm at 25%: ...)", or "—" and why not."""
    said = line["equal_compute"] if isinstance(line["equal_compute"], str) else ""
    if not math.isfinite(line["equal_ours"]):
        return f"— ({said})" if said else "—"
    ours, p_value = number(line["equal_ours"], 2, sign=True), number(line["equal_p_value"], 3)
    return f"{line['equal_verdict']}, {ours} (p {p_value}; {said})"


def claims_head(claims: pd.DataFrame) -> tuple[list, list[str], str]:
    """(the extra columns' renderers, the head, the legend). A claims.csv of an older report may lack a column
    (without its largest task; at equal compute: made without the runs' device-hours) or have nothing in it."""
    extras = [
        (render, head, legend)
        for column, render, head, legend in (
            ("largest_task", without_largest, "Without its largest task", WITHOUT_LARGEST_LEGEND),
            ("equal_compute", equal_compute, "At equal compute", EQUAL_COMPUTE_LEGEND),
        )
        if column in claims and bool(claims[column].fillna("").astype(str).str.len().any())
    ]
    return (
        [render for render, _, _ in extras],
        [*CLAIM_HEAD, *(head for _, head, _ in extras)],
        " ".join([CLAIMS_LEGEND, *(legend for _, _, legend in extras)]),
    )


def pretraining(line: pd.Series) -> str:
    """ "; pretraining seeds 3 and 1" where either row stands on several pretraining runs (a claims.csv of
    before the column: none)."""
    counts = [int(line.get(c, 1) or 1) for c in ("pretrain_seeds", "than_pretrain_seeds")]
    return f"; pretraining seeds {counts[0]} and {counts[1]}" if max(counts) > 1 else ""


CLAIM_HEAD = ["Claim", "Ours", "Paper", "p", "Verdict", "Tasks"]


def claims_markdown(claims: pd.DataFrame) -> str:
    if claims.empty:
        return ""
    extras, head, legend = claims_head(claims)
    out = [legend, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += [
        "| " + " | ".join(c.replace("|", "\\|") for c in _claim_cells(line, extras)) + " |"
        for _, line in claims.iterrows()
    ]
    return "\n".join(out) + "\n"


def claims_html(claims: pd.DataFrame) -> str:
    if claims.empty:
        return ""
    e = html.escape
    css = {"holds": "pos", "reversed": "neg"}
    extras, head, legend = claims_head(claims)
    out = [
        f'<p class="note">{e(legend)}</p>',
        "<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>",
    ]
    for _, line in claims.iterrows():
        cells = _claim_cells(line, extras)
        verdict = f'<td class="{css.get(line["verdict"], "")}">{e(cells[4])}</td>'
        out.append(
            f'<tr><td class="name">{e(cells[0])}</td>'
            + "".join(f"<td>{e(c)}</td>" for c in cells[1:4])
            + verdict
            + "".join(f'<td class="name">{e(c)}</td>' for c in cells[5:])
            + "</tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def claims_details(claims: pd.DataFrame) -> str:
    """The claims table behind a <details> whose summary counts the verdicts (the page stays compact)."""
    if claims.empty:
        return ""
    counts = claims["verdict"].value_counts()
    said = ", ".join(f"{counts[v]} {v}" for v in ("holds", "reversed", "within noise") if v in counts)
    summary = f"<summary>Claims checked: {html.escape(said or 'none decided')}</summary>"
    return f"<details>{summary}\n{claims_html(claims)}\n</details>"


__all__ = [
    "CLAIMS_LEGEND",
    "COMPACT_LEGEND",
    "claims_details",
    "LEGEND",
    "cell_text",
    "claims_html",
    "claims_markdown",
    "number",
    "page_html",
    "table_html",
    "to_csv",
    "to_markdown",
    "verdict_class",
]
