"""The report: the papers' tables and figures regenerated from MLflow, beside the published numbers."""
