"""Scheduled deployments of the reproduce flow, created on a running Prefect server and served from here.

    prefect server start                                             # terminal 1: API + UI, http://127.0.0.1:4200
    PREFECT_API_URL=http://127.0.0.1:4200/api python flows/deployments.py     # terminal 2, from the project root

The second command registers the deployments below (cron schedules in UTC) and then serves them: it polls the
server and runs each scheduled or UI-triggered flow run as a subprocess of itself, in this checkout. Stop it
with Ctrl-C; the deployments stay on the server (shown "Not Ready" until a serve process is back). Runs use
this process's environment: ELECTRALAB_DATA, MLFLOW_TRACKING_URI, RAY_ADDRESS (docs/operations.md).
"""

from __future__ import annotations

import sys

from prefect import serve
from prefect.schedules import Cron
from prefect.settings import PREFECT_API_URL
from reproduce import reproduce

# name, cron (UTC; None: on demand only), parameters, description
DEPLOYMENTS = [
    (
        "nightly-tiny",
        "0 2 * * *",
        {"preset": "tiny"},
        "Every night at 02:00 UTC: the whole tiny preset (every run, every table) on CPU.",
    ),
    (
        "weekly-small",
        "0 4 * * 6",
        {"preset": "small"},
        "Saturdays at 04:00 UTC: the small preset (ELECTRA-Small-sized models, real corpora); needs a GPU.",
    ),
    (
        "tiny-one-table",
        None,
        {"preset": "tiny", "tables": ["coco-lm/table1"]},
        "On demand: COCO-LM Table 1's runs (MLM, ELECTRA, COCO-LM) on the tiny preset, a first look.",
    ),
]


def deployments() -> list:
    return [
        reproduce.to_deployment(
            name,
            schedules=[Cron(cron, timezone="UTC")] if cron else [],
            parameters=parameters,
            description=description,
            tags=["electralab"],
        )
        for name, cron, parameters, description in DEPLOYMENTS
    ]


def main() -> None:
    if not PREFECT_API_URL.value():
        print(
            "error: PREFECT_API_URL is not set. Start a server (`prefect server start`) and point this at it: "
            "PREFECT_API_URL=http://127.0.0.1:4200/api python flows/deployments.py (without it, Prefect would "
            "serve against a temporary server that disappears with this process)",
            file=sys.stderr,
        )
        sys.exit(2)
    serve(*deployments())


if __name__ == "__main__":
    main()
