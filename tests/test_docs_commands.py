"""Every shell command in README.md and docs/*.md, checked as far as it can be without running it, so the docs
cannot drift from the code: the scripts and files it names exist, `make` targets are the Makefile's, the tables
and runs of `flows/reproduce.py` are the registry's, and each `-S key=value` of `dvc exp run` applies to
params.yaml as DVC applies it (an existing key without a prefix, `++` for a key the preset leaves to the code
default) and leaves a configuration that loads. The commands that run a pipeline are run for real by the
pipeline tests (tests/test_flows.py, tests/test_experiments.py).
"""

from __future__ import annotations

import copy
import re
import shlex

import pytest
import yaml
from conftest import ROOT

from electralab.config import parse_params
from electralab.errors import ConfigError
from electralab.runs import TABLES, resolve_all

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)
SCRIPT = re.compile(r"^(?:stages|flows|bench|tests|src|docker)/[\w./-]+\.(?:py|sh|yaml|yml|toml)$")
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|\$\(|\$\{|\*")


def commands() -> list[tuple[str, list[str]]]:
    """(where, tokens) of every command line in a fenced bash block, continuations joined, comments and leading
    environment assignments dropped; a line that is not shell syntax (a placeholder) is left out."""
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for block in FENCE.finditer(text):
            line_no = text[: block.start()].count("\n") + 2
            for i, line in enumerate(block.group(1).replace("\\\n", " ").splitlines()):
                try:
                    tokens = shlex.split(line, comments=True)
                except ValueError:
                    continue
                while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
                    tokens.pop(0)
                if tokens and tokens[0] == "export":
                    continue
                if tokens:
                    out.append((f"{doc.relative_to(ROOT)}:{line_no + i}", tokens))
    return out


COMMANDS = commands()


def test_the_docs_have_commands_to_check():
    assert len(COMMANDS) > 50 and any(t[:3] == ["dvc", "exp", "run"] for _, t in COMMANDS)


@pytest.mark.parametrize("where, tokens", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_names_what_exists(where, tokens):
    for token in tokens:
        if SCRIPT.match(token) and not PLACEHOLDER.search(token):
            assert (ROOT / token).exists(), f"{where}: {token} does not exist"
    if tokens[0] == "make":
        makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
        for target in (t for t in tokens[1:] if not t.startswith("-") and "=" not in t):
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"{where}: no make target {target}"
    if "flows/reproduce.py" in tokens:
        check_reproduce_arguments(where, tokens[tokens.index("flows/reproduce.py") + 1 :])


def check_reproduce_arguments(where: str, args: list[str]) -> None:
    runs = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))["runs"]
    option = None
    for arg in args:
        if arg.startswith("--"):
            option = arg
        elif option == "--tables" and not PLACEHOLDER.search(arg):
            assert arg in TABLES, f"{where}: --tables {arg}: not a table"
        elif option == "--runs" and not PLACEHOLDER.search(arg):
            assert arg in runs, f"{where}: --runs {arg}: not a run of params.yaml"


SETS = [
    (where, tokens[i + 1])
    for where, tokens in COMMANDS
    if tokens[:3] == ["dvc", "exp", "run"]
    for i, token in enumerate(tokens)
    if token in ("-S", "--set-param") and i + 1 < len(tokens)
]


def test_the_docs_set_params():
    assert len(SETS) >= 5


@pytest.mark.parametrize("where, assignment", SETS, ids=[f"{w} {a}" for w, a in SETS])
def test_a_documented_set_param_applies_as_dvc_applies_it_and_loads(where, assignment):
    key, value = assignment.split("=", 1)
    prefix = re.match(r"\+*", key).group()
    *path, last = key[len(prefix) :].split(".")
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    node = params
    for part in path:
        assert isinstance(node.get(part), dict), f"{where}: -S {assignment}: no `{part}` in params.yaml"
        node = node[part]
    if prefix == "":  # DVC (Hydra's grammar): a plain key must be in the file already; ++ adds or sets
        assert last in node, f"{where}: -S {assignment}: `{last}` is not in params.yaml; write -S ++{key}"
    elif prefix == "+":
        assert last not in node, f"{where}: -S {assignment}: `{last}` is in params.yaml already; drop the +"
    node[last] = yaml.safe_load(value)
    try:
        resolve_all(parse_params(copy.deepcopy(params), "params.yaml"))  # every run's settings too
    except ConfigError as e:
        pytest.fail(f"{where}: -S {assignment}: {e}")
