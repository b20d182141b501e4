"""docker/, checked statically (no Docker engine on these machines): the compose file against the Compose
Specification's JSON schema (vendored, tests/schemas/), the services and their wiring, ports bound to localhost,
no credentials in the repository; the Dockerfile's pinned base images and Python, the lock file installed as is;
and every server flag the compose file uses exists in the CLI of the locked versions.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tomllib

import pytest
import yaml
from conftest import ROOT
from project_helpers import BIN

DOCKER = ROOT / "docker"
SCHEMA = ROOT / "tests" / "schemas" / "compose-spec.json"
SCHEMA_SHA256 = "46b7d35f19dd93a05f8fea530291bf84d881c1791ec167ecf0e6fb94e639d496"
SECRETS = ("POSTGRES_PASSWORD", "RAY_AUTH_TOKEN")
VARIABLE = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def interpolate(value, env: dict[str, str]):
    """Compose's variable interpolation (${VAR}, ${VAR:-default}, ${VAR:?error}) over a parsed file."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match) -> str:
        name, op, arg = match.groups()
        if env.get(name):
            return env[name]
        if op and op.endswith("?"):
            raise KeyError(f"{name}: {arg}")
        return arg if op else ""

    return VARIABLE.sub(one, value)


def compose_raw() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())  # YAML anchors and merge keys resolved here


def compose(**env: str) -> dict:
    return interpolate(compose_raw(), {s: "x" * 8 for s in SECRETS} | env)


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) per instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (DOCKER / "Dockerfile").read_text())
    lines = [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]
    return [(l.split(None, 1)[0].upper(), l.split(None, 1)[1] if " " in l else "") for l in lines]


# ---- compose ----------------------------------------------------------------------------------------


def test_the_vendored_schema_is_the_one_noted():
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == SCHEMA_SHA256
    assert SCHEMA_SHA256 in (SCHEMA.parent / "README.md").read_text()


def test_compose_file_follows_the_compose_specification():
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    for name, document in (("as written", compose_raw()), ("interpolated", compose())):
        errors = sorted(validator.iter_errors(document), key=lambda e: list(e.path))
        assert not errors, f"{name}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
    # The schema does catch mistakes (it is not vacuous): a misspelt key and a wrong type fail.
    broken = compose()
    broken["services"]["mlflow"]["command_"] = ["mlflow"]
    broken["services"]["postgres"]["healthcheck"]["retries"] = ["many"]
    assert len(list(validator.iter_errors(broken))) == 2


def test_the_cluster_has_its_services_wired_together():
    services = compose()["services"]
    assert set(services) == {"postgres", "mlflow", "prefect-server", "ray-head", "ray-worker", "flows"}
    assert services["postgres"]["image"].startswith("postgres:17.")
    assert "pgdata:/var/lib/postgresql/data" in services["postgres"]["volumes"]
    mlflow = services["mlflow"]["environment"]
    assert mlflow["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql://electralab:") and mlflow[
        "MLFLOW_BACKEND_STORE_URI"
    ].endswith("@postgres:5432/mlflow")
    assert mlflow["MLFLOW_ARTIFACTS_DESTINATION"] == "/mlartifacts"
    assert "mlartifacts:/mlartifacts" in services["mlflow"]["volumes"]
    assert "--serve-artifacts" in services["mlflow"]["command"]
    prefect = services["prefect-server"]["environment"]
    assert prefect["PREFECT_API_DATABASE_CONNECTION_URL"].endswith("@postgres:5432/prefect")
    assert prefect["PREFECT_API_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://")
    assert "CREATE DATABASE prefect" in (DOCKER / "postgres" / "10-prefect-database.sql").read_text()
    for name in ("mlflow", "prefect-server"):
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"

    worker = services["ray-worker"]
    assert "--address=ray-head:6379" in worker["command"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert compose(RAY_GPU_WORKERS="4")["services"]["ray-worker"]["deploy"]["replicas"] == "4"
    assert "--head" in services["ray-head"]["command"] and "--num-gpus=0" in services["ray-head"]["command"]
    flows = services["flows"]
    assert "flows/deployments.py" in " ".join(flows["command"]) and flows["environment"]["RAY_ADDRESS"] == "auto"
    assert flows["environment"]["PREFECT_API_URL"] == "http://prefect-server:4200/api"
    for name in ("mlflow", "prefect-server", "ray-head", "ray-worker", "flows"):  # one image
        assert services[name]["image"] == "electralab:0.1.0"
        assert services[name]["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
    for name in ("ray-head", "ray-worker", "flows"):  # the checkout at one path on every Ray node
        assert "..:/workspace" in services[name]["volumes"]
        env = services[name]["environment"]
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000" and env["RAY_AUTH_MODE"] == "token"


def test_published_ports_bind_to_localhost_unless_configured_otherwise():
    published = {name: s.get("ports", []) for name, s in compose()["services"].items()}
    assert published == {
        "postgres": [],
        "mlflow": ["127.0.0.1:5000:5000"],
        "prefect-server": ["127.0.0.1:4200:4200"],
        "ray-head": ["127.0.0.1:8265:8265"],
        "ray-worker": [],
        "flows": [],
    }
    opened = compose(ELECTRALAB_BIND="0.0.0.0", MLFLOW_PORT="5555")["services"]["mlflow"]["ports"]
    assert opened == ["0.0.0.0:5555:5000"]


def test_no_credentials_in_the_repository_only_required_variables():
    raw = (DOCKER / "compose.yaml").read_text()
    for secret in SECRETS:
        uses = re.findall(rf"\$\{{{secret}(:?[-?])?[^}}]*\}}", raw)
        assert uses and all(op == ":?" for op in uses), (secret, uses)  # required: no default value
        with pytest.raises(KeyError, match=secret):
            interpolate(compose_raw(), {s: "x" for s in SECRETS if s != secret})
    example = dict(
        l.split("=", 1) for l in (DOCKER / ".env.example").read_text().splitlines() if l and not l.startswith("#")
    )
    assert {s: example[s] for s in SECRETS} == {s: "" for s in SECRETS}
    assert ".env" in (ROOT / ".gitignore").read_text().split()
    # No literal password, token or key anywhere under docker/ (values come from ${...} only).
    literal = re.compile(r"(?i)(password|token|secret)\w*\s*[:=]\s*(?!\$\{)['\"]?[A-Za-z0-9+/_-]{6,}")
    for path in DOCKER.rglob("*"):
        if path.is_file() and path.name != ".env":
            hits = [l for l in path.read_text().splitlines() if literal.search(l) and not l.lstrip().startswith("#")]
            assert not hits, (path, hits)
    documented = (ROOT / "docs" / "operations.md").read_text()
    assert all(s in documented for s in SECRETS)


def test_server_flags_exist_in_the_locked_versions_cli():
    services = compose()["services"]

    def help_of(*cmd: str) -> str:
        proc = subprocess.run(
            [str(BIN / cmd[0]), *cmd[1:], "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            env={"COLUMNS": "200", "PATH": str(BIN), "HOME": "/tmp"},
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    for service, prefix in (
        ("mlflow", ("mlflow", "server")),
        ("ray-head", ("ray", "start")),
        ("ray-worker", ("ray", "start")),
        ("prefect-server", ("prefect", "server", "start")),
    ):
        command = services[service]["command"]
        assert tuple(command[: len(prefix)]) == prefix, command
        text = help_of(*prefix)
        for flag in (a.split("=")[0] for a in command[len(prefix) :] if a.startswith("--")):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), (
                f"{service}: {flag} is not an option of `{' '.join(prefix)}`"
            )
    mlflow_help = help_of("mlflow", "server")
    for variable in services["mlflow"]["environment"]:  # MLflow reads its options from these variables
        option = {
            "MLFLOW_BACKEND_STORE_URI": "--backend-store-uri",
            "MLFLOW_ARTIFACTS_DESTINATION": "--artifacts-destination",
            "MLFLOW_HOST": "--host",
            "MLFLOW_PORT": "--port",
            "MLFLOW_SERVER_ALLOWED_HOSTS": "--allowed-hosts",
        }[variable]
        from mlflow.cli import cli

        envvars = {p.envvar for p in cli.commands["server"].params}
        assert variable in envvars and option in mlflow_help, variable


# ---- Dockerfile -------------------------------------------------------------------------------------


def test_dockerfile_pins_its_base_images_and_python():
    instructions = dockerfile()
    bases = [args.split()[0] for op, args in instructions if op == "FROM"]
    copied = [m for op, args in instructions if op == "COPY" for m in re.findall(r"--from=(\S+)", args)]
    stages = {args.split()[-1] for op, args in instructions if op == "FROM" and " AS " in args.upper()}
    images = bases + [c for c in copied if c not in stages]
    for image in images:
        name, _, tag = image.rpartition(":")
        assert name and re.fullmatch(r"v?\d+\.\d+\.\d+\S*", tag), f"{image}: pin an exact version tag, not {tag!r}"
    gpu = bases[-1]  # the image that runs
    assert re.fullmatch(r"nvidia/cuda:12\.\d+\.\d+-cudnn-runtime-ubuntu\d\d\.04", gpu), gpu

    args = dict(a.split("=", 1) for op, a in instructions if op == "ARG" and "=" in a)
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minor = re.search(r">=(\d+\.\d+)", requires).group(1)
    assert re.fullmatch(rf"{re.escape(minor)}\.\d+", args["PYTHON_VERSION"]), (args, requires)


def test_dockerfile_installs_the_lock_file_and_the_project_without_other_packages():
    runs = [a for op, a in dockerfile() if op == "RUN"]
    copies = [a for op, a in dockerfile() if op == "COPY"]
    installs = [c for r in runs for c in re.split(r"&&|;", r) if re.search(r"\bpip install\b", c)]
    assert any(c.split()[:1] == ["requirements.lock"] for c in copies), copies
    assert any("-r requirements.lock" in c for c in installs), installs
    assert any("--no-deps ." in c for c in installs), installs  # the project itself, nothing it would pull in
    for command in installs:  # nothing else: no unpinned package sneaks in beside the lock
        rest = re.sub(r"-r requirements.lock|--no-deps \.|--no-cache-dir|pip install|\s+", " ", command).strip()
        assert rest == "", f"unexpected install: {command}"
    lock = (ROOT / "requirements.lock").read_text()
    assert re.search(r"^torch==\d", lock, re.M) and re.search(r"^psycopg2-binary==", lock, re.M)
    ignored = [l for l in (ROOT / ".dockerignore").read_text().splitlines() if l and not l.startswith("#")]
    assert ignored[0] == "*" and "!requirements.lock" in ignored and "!src/" in ignored  # no data, venv or DB
    for op, a in dockerfile():
        assert not (op in ("ENV", "ARG") and re.search(r"(?i)password|token|secret", a)), a
