"""The results snapshot: a built report's tables, claims, figures and provenance, copied into a folder that is
committed (results/<preset>/), and the README's headline and docs/results.md rendered from that folder alone.

    python -m electralab.report.snapshot --tables coco-lm/table1 amos/table1 teams/table1   # `make results`
    python -m electralab.report.snapshot --render-only --tables ...                         # the pages only

The report stage writes reports/ from MLflow (its numbers, `dvc repro report`); this copies what a user needs
to see without the runs: report.md, claims.csv, provenance.csv (each pretraining run's MLflow run, commit,
precision, machine, load), tables/, figures/, and built.json (the preset and when the report was built), plus
snapshot.json (when the snapshot was taken, from which commit). tests/test_results.py fails when the README or
docs/results.md differ from what this renders from the committed folder.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from electralab.config import load_params
from electralab.env import repo_root, source_commit
from electralab.errors import ConfigError, DataError
from electralab.io import atomic_dir, read_json, write_json
from electralab.report import stem
from electralab.report.render import claims_markdown
from electralab.tables import TABLES

COPIED = ("report.md", "claims.csv", "provenance.csv", "built.json", "tables", "figures")
PAGES = {"README.md": "headline", "docs/results.md": "results"}  # page -> the block rendered into it


def take(reports: Path, out: Path) -> dict:
    """Copy the report's files into `out` (replaced atomically); returns snapshot.json's content."""
    missing = [name for name in COPIED if not (reports / name).exists()]
    if missing:
        raise DataError(
            f"{reports} is not a built report (no {', '.join(missing)}): run `dvc repro report` (or `make repro`) first"
        )
    taken = {
        "taken_utc": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M}",
        "commit": source_commit(),
        "from": str(reports),
        "command": "make results",
    }
    with atomic_dir(out) as tmp:
        for name in COPIED:
            source = reports / name
            (shutil.copytree if source.is_dir() else shutil.copy2)(source, tmp / name)
        write_json(tmp / "snapshot.json", taken)
    return taken


# --- rendering (from the snapshot's files alone) --------------------------------------------------------------


def headline(folder: Path, tables: list[str]) -> str:
    """The README's block: each claim of the headline tables once (a claim two tables share has the same runs),
    as the report renders claims, under one line of provenance."""
    if not (folder / "claims.csv").exists():
        return none_yet(folder)
    claims = pd.read_csv(folder / "claims.csv")
    claims = claims[claims["table"].isin(tables)].drop_duplicates(["run", "than"]).reset_index(drop=True)
    claims["tasks"] = claims["tasks"].fillna("")
    figure = folder / "figures" / "headline.png"  # a report built before the figure existed has none
    picture = f"![The headline rows' scores, seed by seed]({figure.relative_to(folder.parent.parent)})\n\n"
    return f"{provenance_line(folder)}\n\n{picture if figure.exists() else ''}{claims_markdown(claims)}"


def results_page(folder: Path, tables: list[str]) -> str:
    """docs/results.md's block: the provenance, then each headline table as the report rendered it, and its figures."""
    if not (folder / "claims.csv").exists():
        return none_yet(folder)
    provenance = pd.read_csv(folder / "provenance.csv", dtype=str, keep_default_na=False)
    rows = ["| " + " | ".join(provenance.columns) + " |", "|" + "---|" * len(provenance.columns)]
    rows += ["| " + " | ".join(line) + " |" for line in provenance.itertuples(index=False)]
    parts = [provenance_line(folder), "Pretraining runs:", "\n".join(rows)]
    for key in tables:
        table = folder / "tables" / f"{stem(key)}.md"
        if table.exists():
            parts.append(table.read_text(encoding="utf-8").strip().replace("### ", "## ", 1))
    first = ("headline", "learning_curves")  # ours, then the papers' in name order
    figures = sorted(
        (folder / "figures").glob("*.png"), key=lambda f: (first.index(f.stem) if f.stem in first else 2, f.stem)
    )
    if figures:
        parts.append(
            "## Figures\n\n" + "\n\n".join(f"![{f.stem}](../{f.relative_to(folder.parent.parent)})" for f in figures)
        )
    return "\n\n".join(parts) + "\n"


def provenance_line(folder: Path) -> str:
    built, taken = read_json(folder / "built.json"), read_json(folder / "snapshot.json")
    runs = pd.read_csv(folder / "provenance.csv", dtype=str, keep_default_na=False)
    distinct = lambda column: ", ".join(sorted(set(runs[column]) - {""})) or "not recorded"  # noqa: E731
    return (
        f"The {built['preset']} preset's report, built {built['built_utc']} UTC from {len(runs)} pretraining runs "
        f"(commits {distinct('commit')}; {distinct('machine')}; {distinct('precision')}), snapshot "
        f"`{folder.relative_to(folder.parent.parent)}/` taken {taken['taken_utc']} UTC at {taken['commit']} "
        f"(`{taken['command']}`)."
    )


def none_yet(folder: Path) -> str:
    return (
        f"No results snapshot is committed yet (`{folder.parent.name}/{folder.name}/`):\n`make repro` builds the "
        "report, then `make results` copies it there and renders this block.\n"
    )


def render_into(page: Path, block: str, text: str) -> str:
    """`page`'s text with what stands between `<!-- <block> -->` and `<!-- end <block> -->` replaced by `text`."""
    content = page.read_text(encoding="utf-8")
    pattern = re.compile(rf"(<!-- {block} -->\n).*?(<!-- end {block} -->)", re.S)
    if not pattern.search(content):
        raise ConfigError(f"{page}: no `<!-- {block} -->` ... `<!-- end {block} -->` block to render into")
    return pattern.sub(lambda m: m.group(1) + text.rstrip("\n") + "\n" + m.group(2), content)


def rendered(root: Path, folder: Path, tables: list[str]) -> dict[Path, str]:
    """Every page as it should read for the snapshot in `folder`."""
    texts = {"headline": headline(folder, tables), "results": results_page(folder, tables)}
    return {root / page: render_into(root / page, block, texts[block]) for page, block in PAGES.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m electralab.report.snapshot", description=__doc__.split("\n")[0])
    parser.add_argument("--tables", nargs="+", required=True, help=f"the headline's tables: {', '.join(TABLES)}")
    parser.add_argument("--reports", type=Path, default=Path("reports"), help="the built report (default: reports)")
    parser.add_argument("--render-only", action="store_true", help="render the pages from the committed snapshot")
    args = parser.parse_args(argv)
    root = repo_root()
    try:
        unknown = [t for t in args.tables if t not in TABLES]
        if unknown:
            raise ConfigError(f"--tables {' '.join(unknown)}: not a table; choose from {', '.join(TABLES)}")
        if args.render_only:
            out = root / "results" / load_params(root / "params.yaml").preset
        else:
            built = args.reports / "built.json"
            if not built.is_file():
                raise DataError(f"{built} not found: build the report first (`dvc repro report`, or `make repro`)")
            out = root / "results" / read_json(built)["preset"]
            take(args.reports, out)
        for page, text in rendered(root, out, args.tables).items():
            page.write_text(text, encoding="utf-8")
    except (ConfigError, DataError) as e:
        sys.exit(f"error: {e}")
    print(f"snapshot: {out.relative_to(root)} -> {', '.join(PAGES)}")


if __name__ == "__main__":
    main()
