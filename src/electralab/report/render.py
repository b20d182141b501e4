"""Tables as Markdown, CSV and HTML, and the one self-contained HTML page (figures embedded as PNG).

A cell reads `ours ±std / published (ours − published)`: our median over the fine-tuning seeds and its
standard deviation, the paper's number, and the difference. "—" marks a value that does not exist
(a run not trained yet, a task not fine-tuned, a number the paper does not print) — never a zero.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path

import pandas as pd

from electralab.report.build import BuiltTable

LEGEND = ("Cell: our median ±std over the fine-tuning seeds / the published value (ours − published); "
          "— = not available; failed = fine-tuned, but the model diverged (no number). Reference rows (run \"reference\") are published baselines we do not train.")


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
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1500px; }
table { border-collapse: collapse; margin: 0.5em 0 2em; font-size: 12px; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; vertical-align: top; }
th { background: #f2f2f2; } td.name { text-align: left; white-space: nowrap; }
tr.reference td { color: #777; background: #fafafa; }
.ours { font-weight: 600; } .spread, .pub { color: #666; font-size: 11px; }
.pos { color: #1a7f37; } .neg { color: #c62828; } .note { color: #555; font-size: 13px; }
img { max-width: 100%; border: 1px solid #eee; margin-bottom: 1.5em; }
"""


def _html_cell(line: pd.Series, decimals: int, difference: bool) -> str:
    e = html.escape
    ours = f'<span class="ours">{e(number(line["ours"], decimals, sign=difference))}</span>'
    if not math.isnan(line["std"]):
        ours += (f'<br><span class="spread">±{number(line["std"], decimals)} '
                 f'[{number(line["min"], decimals, sign=difference)}, {number(line["max"], decimals, sign=difference)}]</span>')
    pub = f'<br><span class="pub">paper {e(number(line["published"], decimals, sign=difference))}'
    if not math.isnan(line["diff"]):
        css = "pos" if line["diff"] >= 0 else "neg"
        pub += f' <span class="{css}">({number(line["diff"], decimals, sign=True)})</span>'
    return f"<td>{ours}{pub}</span></td>"


def table_html(table: BuiltTable, note: str = "") -> str:
    e = html.escape
    columns = list(dict.fromkeys(table.frame["column"]))
    has_groups = (table.frame["group"] != "").any()
    anchor = table.spec.key.replace("/", "-")
    out = [f'<h3 id="{anchor}">{e(table.title)}</h3>']
    if note:
        out.append(f'<p class="note">Data: {e(note)}</p>')
    head = (["Group"] if has_groups else []) + ["Row", "Run"] + columns
    out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
    for group, row, run, lines in _rows(table):
        css = ' class="reference"' if run == "reference" else ""
        names = ([group] if has_groups else []) + [row, run]
        cells = "".join(_html_cell(line, table.decimals, _is_difference(table, row)) for _, line in lines.iterrows())
        out.append(f"<tr{css}>" + "".join(f'<td class="name">{e(n)}</td>' for n in names) + cells + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def page_html(title: str, intro: list[str], tables: list[str], figures: dict[str, Path]) -> str:
    """One self-contained page: tables, then every figure inlined as a base64 PNG."""
    e = html.escape
    parts = ["<!doctype html>", '<html><head><meta charset="utf-8">', f"<title>{e(title)}</title>",
             f"<style>{STYLE}</style></head><body>", f"<h1>{e(title)}</h1>"]
    parts += [f'<p class="note">{e(p)}</p>' for p in intro]
    parts += [f'<p class="note">{e(LEGEND)}</p>', "<h2>Tables</h2>", *tables, "<h2>Figures</h2>"]
    for key, path in figures.items():
        data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
        parts.append(f'<h3 id="{e(key.replace("/", "-"))}">{e(key)}</h3><img alt="{e(key)}" '
                     f'src="data:image/png;base64,{data}">')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# --- the claims checked (report/claims.py) --------------------------------------------------------------

CLAIMS_LEGEND = ("Claims: ours = difference of the two rows' median per-seed scores (mean over the tasks listed) "
                 "± the pooled seed std; paper = the same difference in the paper; verdict by Welch's two-sided "
                 "t-test on the per-seed scores, alpha 0.05 (holds / reversed: significant with the paper's sign "
                 "or against it; within noise: not significant). Against the control the premise is that "
                 "pretraining helps.")


def _claim_cells(line: pd.Series) -> list[str]:
    ours = number(line["ours"], 2, sign=True)
    if not math.isnan(line["spread"]):
        ours += f" ±{number(line['spread'], 2)}"
    return [line["claim"], ours, number(line["published"], 2, sign=True), number(line["p_value"], 3),
            str(line["verdict"]), f"{line['tasks']} ({line['seeds']} seeds)" if line["tasks"] else "—"]


CLAIM_HEAD = ["Claim", "Ours", "Paper", "p", "Verdict", "Tasks"]


def claims_markdown(claims: pd.DataFrame) -> str:
    if claims.empty:
        return ""
    out = [CLAIMS_LEGEND, "", "| " + " | ".join(CLAIM_HEAD) + " |", "|" + "---|" * len(CLAIM_HEAD)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in _claim_cells(line)) + " |" for _, line in claims.iterrows()]
    return "\n".join(out) + "\n"


def claims_html(claims: pd.DataFrame) -> str:
    if claims.empty:
        return ""
    e = html.escape
    css = {"holds": "pos", "reversed": "neg"}
    out = [f'<p class="note">{e(CLAIMS_LEGEND)}</p>',
           "<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in CLAIM_HEAD) + "</tr>"]
    for _, line in claims.iterrows():
        cells = _claim_cells(line)
        verdict = f'<td class="{css.get(line["verdict"], "")}">{e(cells[4])}</td>'
        out.append(f'<tr><td class="name">{e(cells[0])}</td>' + "".join(f"<td>{e(c)}</td>" for c in cells[1:4])
                   + verdict + f'<td class="name">{e(cells[5])}</td></tr>')
    out.append("</table>")
    return "\n".join(out)


__all__ = ["CLAIMS_LEGEND", "LEGEND", "cell_text", "claims_html", "claims_markdown", "number", "page_html",
           "table_html", "to_csv", "to_markdown"]
