"""The results snapshot (electralab/report/snapshot.py, `make results`): a built report copied with its
provenance, and the README's headline and docs/results.md rendered from the committed snapshot alone."""

from __future__ import annotations

import re
import shutil

import pandas as pd
import pytest
from conftest import ROOT
from report_helpers import PROVENANCE_TAGS

from electralab.config import load_params
from electralab.errors import DataError
from electralab.report import build_report
from electralab.report.snapshot import PAGES, headline, main, render_into, rendered, results_page, take

HEADLINE = re.search(r"^HEADLINE := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()


def test_the_makefiles_headline_is_the_registrys():
    from electralab import tables

    assert (
        tuple(HEADLINE) == tables.HEADLINE
    )  # the headline figure draws the registry's; make repro trains the Makefile's


def test_the_readme_and_the_results_page_agree_with_the_committed_snapshot():
    folder = ROOT / "results" / load_params(ROOT / "params.yaml").preset
    for page, text in rendered(ROOT, folder, HEADLINE).items():
        assert page.read_text(encoding="utf-8") == text, f"{page.name}: run `make results` (--render-only to re-render)"


@pytest.fixture(scope="module")
def snapshot(store, tmp_path_factory):
    """A report built from the populated store, then snapshot into results/tiny/ of a copy of the pages."""
    root = tmp_path_factory.mktemp("snapshot")
    build_report("tiny", root / "reports", store.uri)
    folder = root / "results" / "tiny"
    taken = take(root / "reports", folder)
    for page in PAGES:
        (root / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, root / page)
    return root, folder, taken


def test_a_snapshot_holds_the_reports_files_and_where_they_came_from(snapshot):
    root, folder, taken = snapshot
    for name in ("report.md", "claims.csv", "provenance.csv", "built.json", "snapshot.json"):
        assert (folder / name).is_file(), name
    assert sorted(p.name for p in (folder / "tables").iterdir()) == sorted(
        p.name for p in (root / "reports" / "tables").iterdir()
    )
    assert re.fullmatch(r"[0-9a-f]{7,}(\+changes)?", taken["commit"]) and taken["command"] == "make results"
    runs = pd.read_csv(folder / "provenance.csv", dtype=str)
    assert set(runs["commit"]) == {PROVENANCE_TAGS["git_sha"]} and set(runs["machine"]) == {"Test CPU"}
    assert set(runs["precision"]) == {"bf16"} and set(runs["load_at_start"]) == {"1.5"}
    assert (runs["run_id"].str.len() == 32).all() and runs["ended"].str.match(r"\d{4}-\d\d-\d\d \d\d:\d\d").all()


def test_the_headline_shows_each_claim_once_with_its_verdict_seeds_and_provenance(snapshot):
    root, folder, taken = snapshot
    text = headline(folder, HEADLINE)
    claims = pd.read_csv(folder / "claims.csv")
    wanted = claims[claims["table"].isin(HEADLINE)].drop_duplicates(["run", "than"])
    lines = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| Claim")]
    assert [line.split(" | ")[0].removeprefix("| ") for line in lines] == list(wanted["claim"])
    for line, (_, claim) in zip(lines, wanted.iterrows()):
        tasks = f"{claim['tasks']} ({claim['seeds']} seeds)" if isinstance(claim["tasks"], str) else "—"
        assert f"| {claim['verdict']} | {tasks} | " in line, line  # then the claim at equal compute
    assert "| At equal compute |" in text and "at 25% has no per-seed scores on the claim's tasks" in text
    said = (folder / "report.md").read_text().split("## What these numbers can and cannot show\n\n")[1]
    assert "decided claims compare a row that stands on one pretraining run" in said.split("## ")[0]
    assert text.startswith("The tiny preset's report, built ") and "commits 0123456789abcdef; Test CPU; bf16" in text
    assert f"taken {taken['taken_utc']} UTC at {taken['commit']} (`make results`)" in text
    assert "![The headline rows' scores, seed by seed](results/tiny/figures/headline.png)" in text  # the picture

    page = results_page(folder, HEADLINE)
    for key in HEADLINE:
        first = (folder / "tables" / f"{key.replace('/', '_')}.md").read_text().splitlines()[0]
        assert first.replace("### ", "## ", 1) in page
    assert (
        "| run | method | run_id |" in page
        and "## Figures\n\n![headline](../results/tiny/figures/headline.png)" in page
    )

    for page, text in rendered(root, folder, HEADLINE).items():  # the pages change only inside their block
        before = page.read_text()
        block = PAGES[page.relative_to(root).as_posix()]
        outside = re.sub(rf"<!-- {block} -->\n.*?<!-- end {block} -->", "", text, flags=re.S)
        assert outside == re.sub(rf"<!-- {block} -->\n.*?<!-- end {block} -->", "", before, flags=re.S)


def test_no_report_a_missing_block_or_an_unknown_table_is_one_clear_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "reports").mkdir()
    with pytest.raises(DataError, match=r"reports is not a built report \(no report.md, claims.csv, .*built.json"):
        take(tmp_path / "reports", tmp_path / "results" / "tiny")
    assert not (tmp_path / "results").exists()  # nothing written
    page = tmp_path / "page.md"
    page.write_text("# no block here\n")
    with pytest.raises(Exception, match=r"page.md: no `<!-- headline -->` ... `<!-- end headline -->` block"):
        render_into(page, "headline", "x")
    with pytest.raises(SystemExit, match=r"error: --tables coco-lm/table9: not a table; choose from coco-lm/table1"):
        main(["--tables", "coco-lm/table9"])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"error: reports/built.json not found: build the report first"):
        main(["--tables", *HEADLINE])


def test_a_results_commit_names_the_checkout_and_says_when_its_tracked_files_differ(tmp_path):
    """electralab.env.source_commit, every result's `commit` (the snapshot, the benches, the GPU sprint's source)."""
    import subprocess

    from electralab.env import source_commit

    assert source_commit(tmp_path) == "unknown"  # a copy of the tree without git
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    (tmp_path / "a.txt").write_text("a")
    for cmd in (["init", "-q"], ["add", "a.txt"], ["commit", "-qm", "a"]):
        subprocess.run([*git, *cmd], cwd=tmp_path, check=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "untracked.txt").write_text("not the source")
    assert source_commit(tmp_path, full=True) == sha and sha.startswith(source_commit(tmp_path))
    (tmp_path / "a.txt").write_text("changed")
    changed = source_commit(tmp_path)
    assert changed.endswith("+changes") and sha.startswith(changed.removesuffix("+changes"))
    assert source_commit(tmp_path, full=True) == sha + "+changes"
