"""The resolved configuration of every run of every preset is pinned: params.yaml states each value once
(presets state only what differs from the code defaults, `methods:` only departures from the papers'),
so a value can change by editing a default in code as easily as a line of params.yaml. This test makes
either kind of change visible: tests/fixtures/resolved_config.json holds what every run of every preset
resolves to (each preset in full, each run's method settings and model changes, each budget's changes).

A deliberate change: update the fixture and say why in the commit,
    PYTHONPATH=src python tests/test_resolved_config.py --write
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "resolved_config.json"
sys.path.insert(0, str(ROOT / "src"))

from electralab.config import BUDGET_PARTS, parse_params, to_dict  # noqa: E402
from electralab.runs import resolve_all  # noqa: E402


def _changed(full: dict, base: dict) -> dict:
    return {k: v for k, v in full.items() if base.get(k) != v}


def resolved(raw: dict) -> dict:
    """{"presets": every preset resolved, "runs": what each run adds (the same at every preset),
    "budgets": per preset, what each budget its runs train at changes of the preset's model, generators
    and pretrain}."""
    out: dict = {"presets": {}, "runs": {}, "budgets": {}}
    for name in raw["presets"]:
        params = parse_params({**copy.deepcopy(raw), "preset": name})
        preset = json.loads(json.dumps(to_dict(params.active)))
        out["presets"][name] = preset
        budgets = out["budgets"][name] = {}
        for run_name, run in resolve_all(params).items():
            p = json.loads(json.dumps(run.as_params()))
            budget = json.loads(json.dumps(to_dict(params.active.budget(p["budget"]))))
            assert p["generators"] == budget["generators"] and p["pretrain"] == budget["pretrain"], run_name
            budgets[p["budget"]] = {part: _changed(budget[part], preset[part]) for part in BUDGET_PARTS}
            own = {
                "method": p["method"],
                "budget": p["budget"],
                "seed": p["seed"],
                "settings": p["settings"],
                "model": {key: p["model"][key] for key in run.spec.model},  # what the run states, resolved
            }
            seen = out["runs"].setdefault(run_name, own)
            assert seen == own, f"run {run_name} resolves differently at preset {name}: {own} vs {seen}"
    return out


def _differences(want, got, path: str = "") -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        return [
            d
            for k in sorted(set(want) | set(got), key=str)
            for d in _differences(want.get(k, "<absent>"), got.get(k, "<absent>"), f"{path}.{k}" if path else k)
        ]
    return [] if want == got else [f"{path}: pinned {want!r}, now {got!r}"]


def current() -> dict:
    return resolved(yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8")))


def test_every_run_of_every_preset_resolves_as_pinned():
    differences = _differences(json.loads(FIXTURE.read_text(encoding="utf-8")), current())
    assert not differences, (
        "the resolved configuration changed (if deliberately: "
        "python tests/test_resolved_config.py --write):\n" + "\n".join(differences[:40])
    )


def test_the_pin_fails_on_any_changed_value():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    raw["presets"]["small"]["pretrain"]["precision"] = "fp32"  # a value the preset did not state
    raw["methods"]["electra"] = {"rtd_weight": 40.0}  # a departure from the paper
    differences = _differences(json.loads(FIXTURE.read_text(encoding="utf-8")), resolved(raw))
    assert set(differences) == {
        "presets.small.pretrain.precision: pinned 'auto', now 'fp32'",
        *(
            f"runs.{run}.settings.rtd_weight: pinned 50.0, now 40.0"
            for run in ("electra", "electra_ablation", "electra_seed2", "electra_seed3")
        ),
    }


def write() -> None:
    data = current()
    lines = ["{", ' "presets": ' + json.dumps(data["presets"], indent=1, sort_keys=True).replace("\n", "\n ") + ","]
    lines.append(' "budgets": ' + json.dumps(data["budgets"], sort_keys=True) + ",")
    lines.append(' "runs": {')
    runs = [f"  {json.dumps(name)}: {json.dumps(run, sort_keys=True)}" for name, run in data["runs"].items()]
    lines.append(",\n".join(runs))
    lines.append(" }")
    lines.append("}")
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert json.loads(FIXTURE.read_text(encoding="utf-8")) == json.loads(json.dumps(data))
    print(f"wrote {FIXTURE.relative_to(ROOT)}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    write()
