"""Fixtures shared across test modules (defined once here, so a session fixture is built once)."""

from report_helpers import store  # noqa: F401  the report tests' populated MLflow store
