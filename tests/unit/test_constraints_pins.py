"""constraints.txt (what CI installs from) pins every dependency pyproject.toml declares, in
every extra, at a version the declared range accepts."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def pins() -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in (ROOT / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[canonicalize_name(name.split("[")[0])] = version.strip()
    return out


def test_every_declared_dependency_is_pinned_within_its_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared += extra
    pinned = pins()
    problems = []
    for raw in declared:
        req = Requirement(raw)
        name = canonicalize_name(req.name)
        if name == "memstream":  # the package's own extras
            continue
        if name not in pinned:
            problems.append(f"{req.name}: no pin in constraints.txt")
        elif not req.specifier.contains(pinned[name], prereleases=True):
            problems.append(f"{req.name}: pinned {pinned[name]}, declared {req.specifier}")
    assert problems == []
