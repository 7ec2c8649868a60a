"""README's "Layout" section and worker/README.md name files that exist.

A newcomer follows a hint, a STOP and a SIGTERM from file names alone; a rename that leaves
the README pointing at a file that is gone would send them nowhere.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE_SPAN = re.compile(r"`([^`\s]+\.py)`")


def layout_section() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("\n## Layout\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_the_layout_section_follows_a_hint_a_stop_and_a_sigterm() -> None:
    section = layout_section()
    for topic in ("**A hint**", "**A STOP**", "**A SIGTERM**"):
        assert topic in section


def test_every_path_the_layout_section_names_exists() -> None:
    paths = CODE_SPAN.findall(layout_section())
    assert len(paths) >= 15  # the section is made of paths; an empty match means it changed
    missing = [p for p in paths if not (REPO / p).is_file()]
    assert missing == []


def test_every_module_the_worker_readme_names_exists() -> None:
    text = (REPO / "worker" / "README.md").read_text(encoding="utf-8")
    package = REPO / "worker" / "wsfleet_worker"
    names = {name for name in CODE_SPAN.findall(text) if "/" not in name}
    assert "session_rules.py" in names
    missing = sorted(name for name in names if not (package / name).is_file())
    assert missing == []
