"""The Dockerfile, docker-compose.yml and .env.example cannot drift from the code.

Docker cannot run on the development machines, so these files are checked by reading them:
every command and option they run exists in the typer apps, every ``PINLOG_*`` variable is a
field of a settings class, every port agrees with the image, and the health endpoint is a
route of both FastAPI apps. The image carries no development extra.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import click
import pytest
import typer.main
import yaml

from app.cli import app as ai_cli
from app.main import create_app as create_worker_app
from app.settings import USE_PROFILE, DatabaseSettings, Settings
from core_service.cli import app as core_cli
from core_service.main import create_app as create_core_app
from core_service.settings import CoreDatabaseSettings, CoreSettings, TokenSettings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text(encoding="utf-8")
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
OFFLINE_TEXT = (ROOT / "docker-compose.offline.yml").read_text(encoding="utf-8")
OFFLINE = yaml.safe_load(OFFLINE_TEXT)
# The production file and the variant that runs without a provider account.
COMPOSES = {"docker-compose.yml": COMPOSE, "docker-compose.offline.yml": OFFLINE}
ENV_EXAMPLE = (ROOT / ".env.example").read_text(encoding="utf-8")

CLIS = {"pinlog-ai": ai_cli, "pinlog-core": core_cli}
SETTINGS = {
    "PINLOG_CORE_": (CoreSettings, CoreDatabaseSettings, TokenSettings),
    "PINLOG_": (Settings, DatabaseSettings),
}
# Variables of the database image (its entrypoint reads them) and of our init script.
DATABASE_IMAGE_VARIABLES = {"POSTGRES_DB", "POSTGRES_USER", "POSTGRES_PASSWORD"}
INIT_SCRIPT_VARIABLES = {"PINLOG_AI_DB_PASSWORD", "PINLOG_CORE_DB_PASSWORD"}
SECRET = "deployment-test-secret-0123456789abcdef"


def _instruction(name: str) -> list[str]:
    """Arguments of every ``name`` instruction (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [m.group(1).strip() for m in re.finditer(rf"^{name}\s+(.*)$", text, re.MULTILINE)]


def _commands() -> list[list[str]]:
    """Every command line the image and compose run, split into argv lists."""
    argvs = [json.loads(_instruction("CMD")[0])]
    services = [s for compose in COMPOSES.values() for s in compose["services"].values()]
    for service in services:
        command = service.get("command")
        if command is None:
            continue
        if command[:2] == ["sh", "-c"]:
            argvs += [shlex.split(part) for part in command[2].split("&&")]
        else:
            argvs.append(command)
    return argvs


def _resolve(argv: list[str]) -> tuple[click.Command, list[str]]:
    """The click command ``argv`` names and the option arguments that follow it."""
    command: click.Command = typer.main.get_command(CLIS[argv[0]])
    rest = argv[1:]
    while isinstance(command, click.Group):
        assert rest and rest[0] in command.commands, f"{argv}: unknown command {rest[:1]}"
        command, rest = command.commands[rest[0]], rest[1:]
    return command, rest


def _option_value(argv: list[str], option: str) -> str | None:
    return argv[argv.index(option) + 1] if option in argv else None


def _field_exists(variable: str) -> bool:
    for prefix, classes in SETTINGS.items():
        if variable.startswith(prefix):
            name = variable.removeprefix(prefix).lower()
            return any(name in cls.model_fields for cls in classes)
    return False


def test_every_command_and_option_exists_and_parses() -> None:
    argvs = _commands()
    assert {argv[0] for argv in argvs} == {"pinlog-ai", "pinlog-core"}
    for argv in argvs:
        command, rest = _resolve(argv)
        # make_context parses and validates every option without running the command.
        command.make_context(argv[0], list(rest))


def test_migrate_upgrades_every_scope_then_smokes_then_loads_presets() -> None:
    command = COMPOSE["services"]["migrate"]["command"][2]
    assert [part.strip() for part in command.split("&&")] == [
        "pinlog-core db upgrade",
        "pinlog-ai smoke",
        "pinlog-ai presets load",
    ]


@pytest.mark.parametrize("compose", COMPOSES.values(), ids=COMPOSES.keys())
def test_every_environment_variable_is_a_settings_field(compose) -> None:
    for name, service in compose["services"].items():
        for variable in service.get("environment", {}):
            if name == "db":
                assert variable in DATABASE_IMAGE_VARIABLES | INIT_SCRIPT_VARIABLES
            else:
                assert _field_exists(variable), f"{name}: {variable} is no settings field"


def test_env_example_names_every_required_secret_and_nothing_unknown() -> None:
    example = {
        line.split("=", 1)[0] for line in ENV_EXAMPLE.splitlines() if re.match(r"^[A-Z_]+=", line)
    }
    compose_text = (ROOT / "docker-compose.yml").read_text(encoding="utf-8")
    required = set(re.findall(r"\$\{([A-Z_]+):\?", compose_text))
    referenced = set(re.findall(r"\$\{([A-Z_]+)", compose_text))
    assert required <= example
    assert example <= referenced
    secret_fields = [
        f"PINLOG_{name.upper()}"
        for name, field in Settings.model_fields.items()
        # The fallback judges' keys are optional: only PINLOG_JUDGE_FALLBACKS names them.
        if field.is_required() or (name.endswith("api_key") and "fallback" not in name)
    ]
    assert set(secret_fields) - {"PINLOG_DATABASE_URL"} <= example
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()
    assert ".env" in (ROOT / ".dockerignore").read_text().splitlines()


@pytest.mark.parametrize("compose", COMPOSES.values(), ids=COMPOSES.keys())
def test_ports_agree_with_the_image(compose) -> None:
    (exposed,) = _instruction("EXPOSE")
    for argv in _commands():
        if argv[1] == "serve":
            assert _option_value(argv, "--port") == exposed
            assert _option_value(argv, "--host") == "0.0.0.0"  # noqa: S104 (inside a container)
    (published,) = compose["services"]["core"]["ports"]
    assert published.split(":")[-1] == exposed
    worker_url = compose["services"]["core"]["environment"]["PINLOG_CORE_WORKER_BASE_URL"]
    workers = [name for name in compose["services"] if name.startswith("worker-")]
    assert len(workers) == 2
    assert worker_url == ",".join(f"http://{name}:{exposed}" for name in workers)
    assert all(
        compose["services"][name]["command"][:2] == ["pinlog-ai", "serve"] for name in workers
    )


def _routes(app) -> set[str]:
    """GET paths of ``app`` (from its OpenAPI schema: included routers are not flattened
    into ``app.routes``)."""
    return {path for path, methods in app.openapi()["paths"].items() if "get" in methods}


def test_healthcheck_endpoint_is_a_route_of_both_services() -> None:
    (healthcheck,) = _instruction("HEALTHCHECK")
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/[a-z]+)", healthcheck)
    assert url is not None
    port, path = url.groups()
    assert port == _instruction("EXPOSE")[0]
    url = "postgresql+asyncpg://u@h/d"
    worker = create_worker_app(
        Settings(database_url=url, internal_secret=SECRET, embedding_api_key="k", judge_api_key="k")
    )
    core = create_core_app(
        CoreSettings(
            database_url=url,
            worker_base_url="http://worker-1:8000,http://worker-2:8000",
            internal_secret=SECRET,
            jwt_secret=SECRET,
            embedding_profile="p",
        )
    )
    assert path in _routes(worker)
    assert path in _routes(core)


def test_image_is_non_root_multi_stage_and_installs_the_lock_file_only() -> None:
    assert len(_instruction("FROM")) >= 2
    assert all("-slim" in line for line in _instruction("FROM"))
    (user,) = _instruction("USER")
    assert user not in {"root", "0"}
    runs = " ".join(_instruction("RUN"))
    assert "pip install -r requirements/runtime.txt" in runs
    assert "pip install --no-deps ." in runs
    assert "[" not in runs, "no extra in the image"
    copied = {line.split()[0] for line in _instruction("COPY") if not line.startswith("--")}
    assert "demo" not in copied and "tests" not in copied


def test_image_copies_every_runtime_package() -> None:
    """``pip install --no-deps .`` installs only what was copied: a package left out imports
    fine in a checkout and fails in the image."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    included = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in included} - {"demo"}
    copied = {line.split()[0] for line in _instruction("COPY") if not line.startswith("--")}
    assert packages <= copied, f"add COPY lines for {sorted(packages - copied)}"


@pytest.mark.parametrize("compose", COMPOSES.values(), ids=COMPOSES.keys())
@pytest.mark.parametrize("service", ["migrate", "worker-1", "worker-2", "core"])
def test_application_services_run_the_image(compose, service: str) -> None:
    assert compose["services"][service]["image"] == "pinlog:latest"
    assert compose["services"][service]["build"] == "."
    assert compose["services"]["db"]["image"].startswith("pgvector/pgvector:")


def test_the_offline_variant_runs_the_same_system_without_a_provider_account() -> None:
    """Same services and commands (but the provider smoke test); the worker side offline; no
    API key, no required variable (``docker compose -f docker-compose.offline.yml up`` with an
    empty environment); the core searches with the offline profile; every setting it gives
    validates."""
    assert OFFLINE["services"].keys() == COMPOSE["services"].keys()
    for name, service in OFFLINE["services"].items():
        online = COMPOSE["services"][name].get("command")
        if name == "migrate":  # no provider to smoke-test: the release step is skipped
            online = [*online[:2], online[2].replace(" && pinlog-ai smoke", "")]
        assert service.get("command") == online, name
    assert "_API_KEY" not in OFFLINE_TEXT
    assert re.findall(r"\$\{[A-Z_]+:\?", OFFLINE_TEXT) == []
    for name in ("migrate", "worker-1", "worker-2"):
        assert OFFLINE["services"][name]["environment"]["PINLOG_OFFLINE"] == "true"
    core_environment = _defaults_filled(OFFLINE["services"]["core"]["environment"])
    assert core_environment["PINLOG_CORE_EMBEDDING_PROFILE"] == USE_PROFILE
    worker_environment = _defaults_filled(OFFLINE["services"]["worker-1"]["environment"])
    worker = Settings(
        **{k.removeprefix("PINLOG_").lower(): v for k, v in worker_environment.items()}
    )
    assert worker.embedding_profile == USE_PROFILE and worker.embedding_api_key is None
    core = CoreSettings(
        **{k.removeprefix("PINLOG_CORE_").lower(): v for k, v in core_environment.items()}
    )
    assert core.search_cuts.floor_word >= 0.24


def _defaults_filled(environment: dict[str, str]) -> dict[str, str]:
    """Each ``${NAME:-default}`` replaced by its default, as compose does with no value set."""
    return {
        key: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value) for key, value in environment.items()
    }
