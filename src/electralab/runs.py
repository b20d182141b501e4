"""The registry of named pretraining runs: one per row of the papers' tables and figures.

params.yaml `runs:` maps a run name to its method, the switches that make it that row, and (for runs
built on another run's output) the path it reads:

    cocolm_converged_aux:
      method: cocolm
      settings: {auxiliary: converged, auxiliary_checkpoint: models/cocolm/auxiliary.pt}
      reads: models/cocolm          # DVC dependency: pretrain@cocolm runs first

The tables and figures a run belongs to are the ones whose rows name it in the table registry
(electralab.tables), not a key of its own.

Another pretraining seed of a row is a run of its own that names the row's run in `seed_of` and differs from it
in `seed` alone (checked): the report pools a row's pretraining seeds (electralab.report.claims), and a table
that needs the row's run needs its seeds too.

    electra_seed2: {method: electra, seed: 2, seed_of: electra}

A run resolves to everything its pretraining needs: method settings (methods.<method> defaults,
then the run's `settings`), and the encoder (the budget's `model`, then the run's `model`), generator
sizes and pretraining schedule of the run's budget at the active preset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from electralab.config import (
    MAIN_BUDGET,
    EncoderConfig,
    GeneratorSizes,
    Params,
    PretrainConfig,
    build,
    deep_merge,
    to_dict,
)
from electralab.errors import ConfigError
from electralab.objectives import METHODS, method_settings
from electralab.tables import FIGURES, REGISTRY, tables_of

TABLES = tuple(REGISTRY)  # every table and figure key (flows/reproduce.py --tables)

DEFAULT_READS = "data/shards"  # every run reads the shards; a dependent run names another output


@dataclass(frozen=True)
class RunSpec:
    method: str
    settings: dict[str, Any] = field(default_factory=dict)  # overrides of methods.<method>
    model: dict[str, Any] = field(default_factory=dict)  # overrides of the preset's model
    reads: str = DEFAULT_READS  # another run's output this run needs
    budget: str = MAIN_BUDGET  # presets.<p>.budgets.<budget>, else the main one
    seed: int | None = None  # None: the preset's pretrain.seed
    seed_of: str | None = None  # the run this one repeats with another pretraining seed (its row's run)
    description: str = ""

    def check(self, where: str) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"{where}.method={self.method!r} is not a method; choose one of {list(METHODS)}")


@dataclass(frozen=True)
class ResolvedRun:
    name: str
    spec: RunSpec
    preset: str
    settings: Any  # the method's Settings dataclass
    model: EncoderConfig
    generators: GeneratorSizes
    pretrain: PretrainConfig

    @property
    def method(self) -> str:
        return self.spec.method

    @property
    def row(self) -> str:
        """The run whose table rows this one is in: itself, or the run it is another pretraining seed of."""
        return self.spec.seed_of or self.name

    @property
    def tables(self) -> tuple[str, ...]:
        return tables_in(self.name, self.spec)

    @property
    def seed(self) -> int:
        return self.pretrain.seed if self.spec.seed is None else self.spec.seed

    def as_params(self) -> dict[str, Any]:
        """Everything that defines the run's training, as a nested plain dict (MLflow params, the resume
        fingerprint). Not its tables: they label it (an MLflow tag) and change when a row is added to any
        table, which must neither retrain it nor stop an interrupted run from resuming."""
        return {
            "run": self.name,
            "method": self.method,
            "preset": self.preset,
            "seed": self.seed,
            "budget": self.spec.budget,
            "settings": to_dict(self.settings),
            "model": to_dict(self.model),
            "generators": to_dict(self.generators),
            "pretrain": to_dict(self.pretrain),
        }

    def param_defaults(self) -> dict[str, Any]:
        """as_params' sections at the code's defaults: what a key added since a checkpoint was written meant
        before it existed (a new key's default keeps the old behaviour), so that checkpoint still resumes."""
        return {
            "settings": to_dict(type(self.settings)()),
            "model": to_dict(EncoderConfig()),
            "generators": to_dict(GeneratorSizes()),
            "pretrain": to_dict(PretrainConfig()),
        }


def tables_in(name: str, spec: RunSpec) -> tuple[str, ...]:
    """The tables and figures a run is in: those naming it, or for another pretraining seed of a row, the tables
    (not the figures, which plot their runs by name) naming the row's run."""
    if spec.seed_of is None:
        return tables_of(name)
    return tuple(key for key in tables_of(spec.seed_of) if key not in FIGURES)


def producer_of(reads: str) -> str | None:
    """The run whose output `reads` names (models/<run>/..., metrics/pretrain/<run>.json), or None."""
    parts = reads.split("/")
    if len(parts) >= 2 and parts[0] == "models":
        return parts[1]
    if len(parts) == 3 and parts[:2] == ["metrics", "pretrain"]:
        return parts[2].removesuffix(".json")
    return None


def _run_spec(params: Params, name: str) -> RunSpec:
    where, value = f"runs.{name}", params.runs[name]
    if isinstance(value, dict) and "tables" in value:  # the key runs had before the table registry
        raise ConfigError(
            f"{where}.tables: a run's tables are the ones that name it in "
            f"src/electralab/tables.py; remove the key and add the run's row there"
        )
    return build(RunSpec, value, where)


def run_specs(params: Params) -> dict[str, RunSpec]:
    return {name: _run_spec(params, name) for name in params.runs}


def check_run(name: str, runs: Iterable[str], where: str = "", source: str = "params.yaml") -> None:
    """A ConfigError naming the run and the known ones where `name` is not a run of the registry `runs`
    (`where`: what named it, e.g. a key path; `source`: the params file the registry is in)."""
    runs = list(runs)
    if name not in runs:
        prefix = f"{where}: " if where else ""
        known = ", ".join(runs) or "(none)"
        raise ConfigError(f"{prefix}run {name!r} is not in {source} runs; known runs: {known}")


def resolve_run(params: Params, name: str) -> ResolvedRun:
    check_run(name, params.runs)
    where = f"runs.{name}"
    spec = _run_spec(params, name)
    defaults = params.methods.get(spec.method) or {}
    if not isinstance(defaults, dict):
        raise ConfigError(f"methods.{spec.method}: expected a mapping of settings")
    settings = method_settings(spec.method, deep_merge(defaults, spec.settings), f"{where}.settings")
    known = {MAIN_BUDGET} | {b for p in params.presets.values() for b in p.budgets}
    if spec.budget not in known:  # a typo would silently train at the main budget
        raise ConfigError(
            f"{where}.budget={spec.budget!r} is not a budget of any preset; known: {', '.join(sorted(known))}"
        )
    budget = params.active.budget(spec.budget, f"presets.{params.preset}")
    model = build(EncoderConfig, deep_merge(to_dict(budget.model), spec.model), f"{where}.model")
    return ResolvedRun(name, spec, params.preset, settings, model, budget.generators, budget.pretrain)


def resolve_all(params: Params) -> dict[str, ResolvedRun]:
    """Every run of the registry, resolved (a config error in any run stops with its key path)."""
    runs = {name: resolve_run(params, name) for name in params.runs}
    for name, run in runs.items():
        reads = run.spec.reads
        if reads != DEFAULT_READS:
            if producer_of(reads) not in runs or producer_of(reads) == name:
                raise ConfigError(
                    f"runs.{name}.reads={reads!r} is not the output of a run in the registry "
                    f"(use models/<run>[/...] or metrics/pretrain/<run>.json)"
                )
    for name in runs:  # a run must not need its own output, through other runs either
        chain = [name]
        while (producer := producer_of(runs[chain[-1]].spec.reads)) in runs:
            if producer in chain:
                raise ConfigError(
                    f"runs.{name}.reads: the runs read each other's output in a cycle "
                    f"({' -> '.join([*chain[chain.index(producer) :], producer])}); no order can train them"
                )
            chain.append(producer)
    check_seeds(runs)
    return runs


def check_seeds(runs: dict[str, ResolvedRun]) -> None:
    """A run with `seed_of` is its row's run again with another pretraining seed, and nothing else."""
    seeds: dict[str, dict[int, str]] = {}
    for name, run in runs.items():
        base = run.spec.seed_of
        if base is None:
            continue
        where = f"runs.{name}.seed_of"
        if base not in runs or runs[base].spec.seed_of is not None or base == name:
            raise ConfigError(f"{where}={base!r} is not a run of the registry that is not itself another's seed")
        mine, theirs = run.as_params(), runs[base].as_params()
        differ = [k for k in mine if k not in ("run", "seed") and mine[k] != theirs[k]]
        if differ or run.spec.reads != runs[base].spec.reads:
            what = differ[0] if differ else "reads"
            others = ", ".join(f"runs.{n}" for n, r in runs.items() if r.spec.seed_of == base)
            raise ConfigError(
                f"runs.{name}: another pretraining seed of {base!r} must train as it does but for `seed`; "
                f"its {what} differs (a row's seeds change together: runs.{base} and "
                f"{others} state the same method, settings, model, budget and reads)"
            )
        taken = seeds.setdefault(base, {runs[base].seed: base})
        if run.seed in taken:
            whence = (
                " (the preset's pretrain.seed; pick one no seed run of a row uses)"
                if runs[taken[run.seed]].spec.seed is None
                else ""
            )
            raise ConfigError(
                f"runs.{name}.seed={run.seed}: {taken[run.seed]!r} already pretrains {base!r} with that seed{whence}"
            )
        taken[run.seed] = name


def runs_for_tables(params: Params, tables: list[str]) -> list[str]:
    """The runs a set of tables needs (each row's pretraining seeds among them), with the runs they read from
    (dependencies first)."""
    unknown = [t for t in tables if t not in TABLES]
    if unknown:
        raise ConfigError(f"table {unknown[0]!r} is not a table; known: {', '.join(TABLES)}")
    specs = run_specs(params)
    return with_producers(specs, [n for n, s in specs.items() if set(tables_in(n, s)) & set(tables)])


def training_cost(run: ResolvedRun, vocab_size: int) -> float:
    """A run's pretraining compute up to a constant factor, to order runs cheapest-first (bench/ measures the
    real thing): tokens x the weights of its matrix products (main model, auxiliary, heads), as FLOPs grow
    (6 N a token); the sequence length is the preset's, the same for every run. The control trains nothing: 0."""
    from torch import nn

    from electralab.objectives import build_objective

    objective = build_objective(run.method, run.settings, run.model, run.generators, vocab_size)
    if not objective.trains:
        return 0.0
    weights = sum(m.weight.numel() for m in objective.modules() if isinstance(m, nn.Linear))
    return float(run.pretrain.steps * run.pretrain.batch_size * weights)


def cheapest_first(params: Params, runs: dict[str, ResolvedRun], names: list[str]) -> dict[str, float]:
    """`names` and the runs they read, cheapest training first (a producer still before its readers; ties keep
    the registry's order; other pretraining seeds after every row's first run), each with its training_cost: a
    long command gives its first rows, the control's among them, early, and can tell how long the rest will take
    from the pace of the first. `runs`: the registry resolved (resolve_all)."""
    specs = {name: run.spec for name, run in runs.items()}
    names = with_producers(specs, names)
    # A run that reads another's output is built from it (so not before it exists): its producer's cost stands
    # for its own (the same shape and budget, one setting apart).
    cost = {
        name: training_cost(runs[producer_of(specs[name].reads) or name], params.active.vocab.size) for name in names
    }
    # Every row's first pretraining run before any row's other seeds: a long command shows every row early.
    order = sorted(names, key=lambda name: (specs[name].seed_of is not None, cost[name]))
    return {name: cost[name] for name in with_producers(specs, order)}


def with_producers(specs: dict[str, RunSpec], names: list[str]) -> list[str]:
    """`names` and the runs whose outputs they read (runs.<run>.reads), producers first, no repeats."""
    ordered: list[str] = []

    def visit(name: str) -> None:
        producer = producer_of(specs[name].reads)
        if producer in specs and producer not in ordered:
            visit(producer)
        if name not in ordered:
            ordered.append(name)

    for name in names:
        visit(name)
    return ordered


__all__ = [
    "TABLES",
    "RunSpec",
    "ResolvedRun",
    "producer_of",
    "cheapest_first",
    "training_cost",
    "resolve_run",
    "resolve_all",
    "run_specs",
    "check_seeds",
    "runs_for_tables",
    "with_producers",
    "check_run",
]
