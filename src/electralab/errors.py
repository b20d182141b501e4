"""Errors a stage reports as one clear line (exit 2) instead of a traceback."""

from __future__ import annotations

from typing import Iterator


class ConfigError(ValueError):
    """Bad configuration or input: the message names the key path or file, the value and what is allowed."""


class DataError(ValueError):
    """Bad input data (missing, empty, unreadable, corrupt): the message names the file and what is wrong."""


class TrainingFailed(RuntimeError):
    """Pretraining stopped because the run is broken (diverged or collapsed), not because of bad input."""


class TrainingDiverged(TrainingFailed):
    """The loss (or gradient norm) stopped being finite; the message names the run, step and checkpoint."""


class RepresentationCollapsed(TrainingFailed):
    """The collapse guard found a run that stopped learning (held-out diagnostics, docs/training.md); the
    message names the run, the step and what collapsed."""


class TrialsFailed(RuntimeError):
    """Fine-tuning trials failed after their retries; the message names them, their error and where the
    finished ones are kept (a re-run resumes from there)."""


class StageBusy(RuntimeError):
    """The same stage (and run) is already running in this project: the message names it and its process."""


class Stopped(BaseException):
    """A stop signal (SIGTERM, SIGINT) ended the stage: a BaseException, as KeyboardInterrupt is, so that no
    `except Exception` takes it for a failure. The message says where the next run resumes."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


def chain(error: BaseException | None) -> Iterator[BaseException]:
    """`error`, then what caused it (`raise ... from`, or the error being handled when it was raised), and so on:
    libraries wrap the errors that matter here (a stop signal, a full disk) in their own."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def stopped_by(error: BaseException) -> Stopped | None:
    """The stop signal behind `error`, if any: a library that checks signals in C (Ray's `ray.wait`) turns the
    Stopped our handler raised into its own error (SystemError "returned a result with an exception set")."""
    return next((e for e in chain(error) if isinstance(e, Stopped)), None)


def failed_or_killed(error: BaseException) -> str:
    """The MLflow status of a run that `error` ended: KILLED for a stop signal (however wrapped), else FAILED."""
    return "KILLED" if stopped_by(error) is not None or not isinstance(error, Exception) else "FAILED"


EXPECTED_ERRORS = (ConfigError, DataError, TrainingFailed, TrialsFailed, StageBusy)
EXIT_BAD_INPUT = 2  # a stage's exit status on an expected error: a retry cannot fix it
