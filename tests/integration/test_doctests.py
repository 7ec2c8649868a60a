"""Every example in a docstring runs, so the examples readers copy stay true to the code.

The shared package, the worker and the local tools are full of ``>>>`` examples; nothing ran
them, and four had drifted (names they never imported, a backend on a fixed port). Each
module's examples run here with the session's embedded backend bound to ``backend``, for the
examples that create tables and queues on it.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from types import ModuleType

import pytest

PACKAGES = ("wsfleet", "wsfleet_worker", "wsfleet_local")


def _modules() -> list[str]:
    names: list[str] = []
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        names.append(package_name)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}."):
            if not info.name.endswith("__main__"):
                names.append(info.name)
    return sorted(names)


MODULES = _modules()


def _examples(module: ModuleType) -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    return [test for test in finder.find(module) if test.examples]


def test_the_packages_have_examples() -> None:
    """The runner finds what it is meant to run (a wrong package walk would pass vacuously)."""
    counted = sum(
        len(test.examples) for name in MODULES for test in _examples(importlib.import_module(name))
    )
    assert counted >= 100


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name: str, backend) -> None:
    module = importlib.import_module(module_name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in _examples(module):
        test.globs["backend"] = backend
        runner.run(test, clear_globs=True)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, f"{results.failed} of {results.attempted} examples failed"
