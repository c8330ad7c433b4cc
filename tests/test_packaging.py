"""pyproject.toml and environment.yml must ask for the same packages, so conda and pip users get one kit."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"pytorch": "torch"}


def _split(requirement: str) -> tuple[str, str]:
    match = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", requirement)
    assert match, requirement
    return match.group(1).lower().replace("_", "-"), match.group(2).replace(" ", "")


def test_environment_yml_lists_the_same_dependencies_as_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = dict(_split(r) for r in project["dependencies"])
    for extra in ("test", "bench"):
        wanted.update(_split(r) for r in project["optional-dependencies"][extra])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    listed: dict[str, str] = {}
    for entry in env["dependencies"]:
        if isinstance(entry, dict):
            listed.update(_split(r) for r in entry["pip"])
        else:
            name, spec = _split(entry)
            if name not in ("python", "pip"):
                listed[CONDA_NAMES.get(name, name)] = spec
    assert listed == wanted


def test_python_range_agrees() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    python = next(e for e in env["dependencies"] if isinstance(e, str) and e.startswith("python"))
    assert python.replace("python", "") == project["requires-python"]
