"""Documentation a newcomer can trust: the README renders as written, its
commands and links exist, every § and FC-nn the repository cites resolves inside it, and the
configuration page matches the settings classes."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import click
import typer
from markdown_it import MarkdownIt

from app.cli import app as worker_cli
from core_service.cli import app as core_cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CLIS = {"pinlog-ai": worker_cli, "pinlog-core": core_cli}
CITED_SOURCES = (
    "app",
    "core_service",
    "pinlog_platform",
    "demo",
    "bench",
    "tests",
    "docs",
)


def _tokens(path: Path):
    return MarkdownIt("commonmark").enable("table").parse(path.read_text(encoding="utf-8"))


def test_every_readme_heading_renders_as_a_heading():
    """A code fence closed mid-line would swallow the sections after it. Lines between fence
    lines (shell comments such as ``# -> 200``) are not headings."""
    source_headings, fenced = [], False
    for line in README.read_text(encoding="utf-8").splitlines():
        fenced ^= line.startswith("```")
        if not fenced and re.match(r"^#{1,3} ", line):
            source_headings.append(line.lstrip("#").strip())
    tokens = _tokens(README)
    rendered = [
        tokens[index + 1].content
        for index, token in enumerate(tokens)
        if token.type == "heading_open"
    ]
    assert rendered == source_headings
    assert "Two commands" in rendered and "Operating the services" in rendered


def _shell_lines() -> list[list[str]]:
    commands = []
    for token in _tokens(README):
        if token.type == "fence" and token.info.strip() == "sh":
            for line in token.content.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0].strip()
                if line and not line.startswith(("#", "export ", "TOKEN=", "SECRET=")):
                    commands.append(shlex.split(line, comments=True))
    return commands


def test_every_pinlog_command_in_the_readme_exists_and_parses():
    pinlog_commands = [argv for argv in _shell_lines() if argv[0] in CLIS]
    assert len(pinlog_commands) >= 7
    for argv in pinlog_commands:
        command: click.Command = typer.main.get_command(CLIS[argv[0]])
        rest = argv[1:]
        while isinstance(command, click.Group):
            assert rest and rest[0] in command.commands, f"{argv}: unknown command"
            command, rest = command.commands[rest[0]], rest[1:]
        command.make_context(argv[0], list(rest))  # parses every option without running


def test_every_make_target_in_the_readme_exists():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, flags=re.M))
    used = {argv[1] for argv in _shell_lines() if argv[0] == "make"}
    used |= set(re.findall(r"`make ([a-z][a-z-]*)`", README.read_text(encoding="utf-8")))
    assert used and used <= targets


def test_every_relative_link_in_the_docs_points_at_a_file():
    broken = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.name} -> {target}")
    assert broken == []


def _cited(pattern: str) -> set[str]:
    found: set[str] = set()
    paths = [README, *(p for d in CITED_SOURCES for p in (ROOT / d).rglob("*") if p.is_file())]
    for path in paths:
        if path.suffix in {".py", ".md", ".sql", ".yaml"} and ".venv" not in path.parts:
            found |= set(re.findall(pattern, path.read_text(encoding="utf-8", errors="replace")))
    return found


def test_every_contract_section_and_field_case_cited_resolves_inside_the_repository():
    sections = set(re.findall(r"^## (§\d+)", (ROOT / "docs/contract.md").read_text(), flags=re.M))
    cases = set(
        re.findall(r"^\| (FC-\d+) \|", (ROOT / "docs/field-cases.md").read_text(), flags=re.M)
    )
    assert _cited(r"§\d+") <= sections
    assert _cited(r"FC-\d+") <= cases


def test_the_configuration_page_matches_the_settings_classes():
    spec = importlib.util.spec_from_file_location("render", ROOT / "docs/render_configuration.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = (ROOT / "docs/configuration.md").read_text(encoding="utf-8")
    assert committed == module.render(), "run `make docs` and commit docs/configuration.md"


DOC_PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))
# Where a path quoted in the docs without its package may live (``service/search.py``).
PACKAGE_ROOTS = tuple(
    ROOT / part for part in ("", "app", "core_service", "pinlog_platform", "tests")
)
QUOTED_PATH = re.compile(r"`([\w./*-]+/[\w.*-]+\.(?:py|sql|md|yaml|yml|json|toml|txt|sh))`")


def test_the_docs_stand_alone():
    """No file outside the repository (``../shared/...``, absolute paths), no ticket numbers
    ("issue 9"), and every repository path quoted in backticks exists (paths that moved)."""
    problems = []
    for page in DOC_PAGES:
        content = page.read_text(encoding="utf-8")
        for outside in re.findall(r"(?<![\w.])\.\./[\w./-]+|/work/[\w./-]+", content):
            problems.append(f"{page.name}: outside the repository: {outside}")
        for ticket in re.findall(r"\b(?:[Ii]ssue|[Tt]icket)s? #?\d+|\bH\d+\b", content):
            problems.append(f"{page.name}: ticket number: {ticket}")
        for quoted in QUOTED_PATH.findall(content):
            if "NNNN" in quoted:
                continue  # a name pattern, not a file
            if not any(list(base.glob(quoted)) for base in PACKAGE_ROOTS):
                problems.append(f"{page.name}: no such file: {quoted}")
    assert problems == []


def test_the_openapi_documents_match_the_apps():
    spec = importlib.util.spec_from_file_location("openapi", ROOT / "docs/render_openapi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, text in module.render().items():
        committed = (ROOT / "docs/openapi" / name).read_text(encoding="utf-8")
        assert committed == text, f"run `make openapi` and commit docs/openapi/{name}"


def test_every_status_of_the_client_document_has_an_example():
    """Each answer the client API's document lists carries an example body. Which statuses
    each route lists is compared with the routes' real answers in
    ``tests/core/api/test_error_answers.py``."""
    import json

    document = json.loads((ROOT / "docs/openapi/core-client.json").read_text(encoding="utf-8"))
    for path, operations in document["paths"].items():
        if path == "/healthz":
            continue  # the liveness route both services share (pinlog_platform/http/probes.py)
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                if status != "204" and "content" in answer:
                    assert "example" in answer["content"]["application/json"], (
                        path,
                        method,
                        status,
                    )
