"""worker/constraints.txt (the image's production pins) against requirements-dev.txt.

The image installs layers/wsfleet and worker/ with worker/constraints.txt, not the development
lockfile. This checks that it pins exactly their runtime dependency closure (read from the
installed distributions' metadata) at the development lockfile's versions.
"""

from __future__ import annotations

import re
from importlib.metadata import distribution
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            found[normalize(name.split("[", 1)[0])] = version.strip()
    return found


def runtime_closure(*roots: str) -> set[str]:
    """Every distribution the roots need at run time (no extras), transitively."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = normalize(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for spec in distribution(name).requires or []:
            requirement = Requirement(spec)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen - {normalize(r) for r in roots}


def test_production_pins_are_the_runtime_closure_at_the_lockfile_versions() -> None:
    production = pins(ROOT / "worker" / "constraints.txt")
    development = pins(ROOT / "requirements-dev.txt")

    assert set(production) == runtime_closure("wsfleet", "wsfleet-worker")
    for name, version in production.items():
        assert development.get(name) == version, name


def test_the_image_installs_with_the_production_pins() -> None:
    dockerfile = (ROOT / "worker" / "Dockerfile").read_text()
    assert "COPY worker/constraints.txt ./constraints.txt" in dockerfile
    assert "requirements-dev.txt" not in dockerfile.split("FROM", 1)[1]
