"""requirements/runtime.txt (pip-compile of pyproject.toml) pins what the image installs.

It must pin every runtime dependency of pyproject.toml at a version the specifier admits,
and nothing from the development extras. Regenerate with ``make lock``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
LOCK = (ROOT / "requirements" / "runtime.txt").read_text(encoding="utf-8")


def _pins() -> dict[str, Version]:
    pins = {}
    for line in LOCK.splitlines():
        match = re.match(r"^([A-Za-z0-9._-]+)==([^\s;]+)", line)
        if match:
            pins[canonicalize_name(match[1])] = Version(match[2])
    return pins


def test_every_runtime_dependency_is_pinned_within_its_specifier() -> None:
    pins = _pins()
    for spec in PROJECT["dependencies"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned: run make lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} does not satisfy {requirement.specifier}: run make lock"
        )


def test_lock_file_was_generated_from_pyproject_without_extras() -> None:
    assert "pip-compile" in LOCK and "pyproject.toml" in LOCK
    assert "--extra" not in LOCK and "--all-extras" not in LOCK
    extras = {
        canonicalize_name(Requirement(spec).name)
        for specs in PROJECT["optional-dependencies"].values()
        for spec in specs
    }
    runtime = {canonicalize_name(Requirement(spec).name) for spec in PROJECT["dependencies"]}
    assert not (extras - runtime) & set(_pins()), "a development extra leaked into the image"
    assert "pgserver" not in _pins()


def test_no_line_points_at_a_local_index() -> None:
    assert not re.search(r"^(--find-links|--index-url|--extra-index-url|-f )", LOCK, re.MULTILINE)


def test_the_image_and_the_venv_get_current_build_tools() -> None:
    """setuptools 65.5.0 (the venv default of Python 3.11) has known CVEs."""
    tools = (ROOT / "requirements" / "build-tools.txt").read_text(encoding="utf-8")
    pins = dict(re.findall(r"^([a-z]+)==(\S+)$", tools, flags=re.MULTILINE))
    assert Version(pins["setuptools"]) >= Version("78.1.1")
    assert Version(pins["pip"]) >= Version("25.3")
    assert "pip install --upgrade -r requirements/build-tools.txt" in (
        ROOT / "Dockerfile"
    ).read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "--upgrade -r requirements/build-tools.txt" in makefile
    assert "--output-file=requirements/build-tools.txt" in makefile
