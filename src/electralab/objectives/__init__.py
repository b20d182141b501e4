"""One module per pretraining method; each returns the total loss plus named diagnostics.

settings = method_settings("cocolm", {"scl": False})   # checked here, once: a bad value is a ConfigError
objective = build_objective("cocolm", settings, model_cfg, generator_sizes, vocab_size)
out = objective(batch, progress=step / total_steps)   # out.loss, out.metrics
"""

from __future__ import annotations

from typing import Any

from electralab.config import EncoderConfig, GeneratorSizes, build
from electralab.errors import ConfigError
from electralab.objectives.amos import Amos
from electralab.objectives.cocolm import CocoLM
from electralab.objectives.common import Objective, Output
from electralab.objectives.electra import Electra
from electralab.objectives.mlm import MLM
from electralab.objectives.none import NoPretraining
from electralab.objectives.teams import Teams

METHODS: dict[str, type[Objective]] = {
    "mlm": MLM,
    "electra": Electra,
    "cocolm": CocoLM,
    "amos": Amos,
    "teams": Teams,
    "none": NoPretraining,
}


def method_settings(method: str, values: dict[str, Any] | None, where: str = "methods") -> Any:
    """The checked Settings dataclass of `method` from a plain mapping (params.yaml values)."""
    if method not in METHODS:
        raise ConfigError(f"{where}: method={method!r} is not a method; choose one of {list(METHODS)}")
    return build(METHODS[method].Settings, values or {}, f"{where}.{method}" if where == "methods" else where)


def build_objective(
    method: str, settings: Any, model: EncoderConfig, generators: GeneratorSizes, vocab_size: int
) -> Objective:
    """`settings`: the method's checked Settings (from method_settings, or a resolved run's)."""
    return METHODS[method](model, generators, vocab_size, settings)


__all__ = ["METHODS", "Objective", "Output", "build_objective", "method_settings"]
