"""Issue #28: no signal handler in the tree calls into threading primitives.

Python runs a ``signal.signal`` handler in the main thread between two bytecodes of whatever
it interrupted, possibly inside a lock; a handler that takes a lock (an Event's ``set``, a
logger, a print, a queue) can wait forever for the very frame it interrupted. So such a
handler may only *record*: assign and count, write to a pipe (``os.write``), put handlers
back (``signal.signal``), and call methods of its own class that obey the same rule.
``loop.add_signal_handler`` callbacks run on the event loop as ordinary callbacks (asyncio's
own handler only writes to a wakeup fd), so for them the rule is the narrower one: nothing
from ``threading``.

The scan reads every Python file of the project (AST, no import), finds each registration,
resolves the handler (a method through ``self``, a function of the module, a lambda) and walks
what it calls within its class or module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = ("layers", "worker", "functions", "local", "bench", "tests")

#: What a ``signal.signal`` handler may call, besides its own class's checked methods.
RECORD_ONLY_CALLS = {"os.write", "signal.signal", "contextlib.suppress", "len"}
#: Methods of plain containers (no lock inside).
CONTAINER_METHODS = {"items", "keys", "values", "get", "copy"}
#: Names that make anything from threading a threading primitive.
THREADING_NAMES = {"Event", "Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore",
                   "Barrier", "Thread", "Timer"}  # fmt: skip


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


@dataclass
class Handler:
    path: Path
    line: int
    kind: str  # "signal.signal" or "add_signal_handler"
    node: ast.FunctionDef | ast.Lambda
    cls: ast.ClassDef | None
    module: ast.Module

    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


class _Parents(ast.NodeVisitor):
    def __init__(self) -> None:
        self.cls: dict[ast.AST, ast.ClassDef | None] = {}
        self.funcs: dict[ast.AST, ast.AST | None] = {}
        self._cls: list[ast.ClassDef] = []
        self._fn: list[ast.AST] = []

    def generic_visit(self, node: ast.AST) -> None:
        self.cls[node] = self._cls[-1] if self._cls else None
        self.funcs[node] = self._fn[-1] if self._fn else None
        is_cls = isinstance(node, ast.ClassDef)
        is_fn = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        if is_cls:
            self._cls.append(node)
        if is_fn:
            self._fn.append(node)
        super().generic_visit(node)
        if is_cls:
            self._cls.pop()
        if is_fn:
            self._fn.pop()


def _python_files() -> Iterator[Path]:
    for root in SOURCE_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if not {".venv", "node_modules", ".aws-sam", "build"} & set(path.parts):
                yield path


def _method(cls: ast.ClassDef | None, name: str) -> ast.FunctionDef | None:
    if cls is None:
        return None
    for item in cls.body:
        if isinstance(item, ast.FunctionDef) and item.name == name:
            return item
    return None


def _function(scope: ast.AST, name: str) -> ast.FunctionDef | None:
    for item in ast.walk(scope):
        if isinstance(item, ast.FunctionDef) and item.name == name:
            return item
    return None


def find_handlers() -> list[Handler]:
    found = []
    for path in _python_files():
        module = ast.parse(path.read_text(encoding="utf-8"), str(path))
        parents = _Parents()
        parents.visit(module)
        for call in ast.walk(module):
            if not isinstance(call, ast.Call) or len(call.args) < 2:
                continue
            name = _dotted(call.func)
            if name == "signal.signal":
                kind = "signal.signal"
            elif name.endswith(".add_signal_handler"):
                kind = "add_signal_handler"
            else:
                continue
            target, cls = call.args[1], parents.cls.get(call)
            node: ast.FunctionDef | ast.Lambda | None = None
            if isinstance(target, ast.Lambda):
                node = target
            elif isinstance(target, ast.Attribute) and _dotted(target.value) == "self":
                node = _method(cls, target.attr)
            elif isinstance(target, ast.Name):
                node = _function(parents.funcs.get(call) or module, target.id) or _function(
                    module, target.id
                )
            # Anything else is a value put back (SIG_DFL, an original handler), not code here.
            if node is not None:
                found.append(Handler(path, call.lineno, kind, node, cls, module))
    return found


def _threading_attributes(cls: ast.ClassDef | None) -> set[str]:
    """``self.x`` attributes of the class assigned a threading primitive."""
    attrs: set[str] = set()
    if cls is None:
        return attrs
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Call):
            maker = _dotted(node.value.func)
            if maker.startswith("threading.") or maker in THREADING_NAMES:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                attrs |= {t.attr for t in targets if isinstance(t, ast.Attribute)}
    return attrs


def violations(handler: Handler) -> list[str]:
    """What the handler (and what it calls in its class/module) does that its kind may not."""
    problems: list[str] = []
    threaded = _threading_attributes(handler.cls)
    seen: set[int] = set()
    todo: list[ast.AST] = [handler.node]
    while todo:
        body = todo.pop()
        if id(body) in seen:
            continue
        seen.add(id(body))
        for node in ast.walk(body):
            line = getattr(node, "lineno", handler.line)
            if isinstance(node, ast.Attribute) and _dotted(node.value) == "self" and (
                node.attr in threaded
            ):
                problems.append(f"line {line}: self.{node.attr} is a threading primitive")
            if isinstance(node, ast.Name | ast.Attribute) and _dotted(node).startswith(
                "threading."
            ):
                problems.append(f"line {line}: uses {_dotted(node)}")
            if handler.kind != "signal.signal":
                continue
            if isinstance(node, ast.Raise | ast.Await | ast.Yield | ast.YieldFrom):
                problems.append(f"line {line}: {type(node).__name__.lower()} in a handler")
            if isinstance(node, ast.With):
                for item in node.items:
                    if _dotted(getattr(item.context_expr, "func", item.context_expr)) != (
                        "contextlib.suppress"
                    ):
                        problems.append(f"line {line}: with {ast.unparse(item.context_expr)}")
            if not isinstance(node, ast.Call):
                continue
            name = _dotted(node.func)
            own = name.split(".", 1)[1] if name.startswith("self.") else None
            if own is not None and "." not in own and (method := _method(handler.cls, own)):
                todo.append(method)
            elif isinstance(node.func, ast.Name) and (fn := _function(handler.module, name)):
                todo.append(fn)
            elif name not in RECORD_ONLY_CALLS and not (
                isinstance(node.func, ast.Attribute) and node.func.attr in CONTAINER_METHODS
            ):
                problems.append(f"line {line}: calls {name}() (only recording is allowed)")
    return problems


HANDLERS = find_handlers()


def test_the_scan_finds_the_handlers_it_is_meant_to_check():
    # GIVEN the tree WHEN it is scanned THEN it finds both kinds of handler (a scan that
    # found nothing would pass whatever the handlers did)
    names = {(h.kind, getattr(h.node, "name", "<lambda>")) for h in HANDLERS}
    assert ("signal.signal", "_handle") in names  # wsfleet_local.procs.StopSignals
    assert ("add_signal_handler", "_on_signal") in names  # wsfleet_worker.worker.Worker


@pytest.mark.parametrize("handler", HANDLERS, ids=Handler.where)
def test_no_signal_handler_takes_a_lock(handler):
    # GIVEN a signal handler of the tree WHEN what it runs is walked
    # THEN it only records (signal.signal) / uses nothing from threading (event loop)
    assert violations(handler) == [], handler.where()


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # the handler of issue #28: an Event set from the handler, and a raise
        (
            "import signal, threading\n"
            "class S:\n"
            "    def __init__(self):\n"
            "        self.should_exit = threading.Event()\n"
            "        signal.signal(signal.SIGTERM, self._handle)\n"
            "    def _handle(self, signum, frame):\n"
            "        if self.should_exit.is_set():\n"
            "            raise KeyboardInterrupt\n"
            "        self.should_exit.set()\n",
            ["is a threading primitive", "raise in a handler", "calls self.should_exit.set()"],
        ),
        # logging, through a helper of the module
        (
            "import logging, signal\n"
            "def note(): logging.getLogger().info('stop')\n"
            "def on_term(signum, frame): note()\n"
            "signal.signal(signal.SIGTERM, on_term)\n",
            ["calls logging.getLogger()"],
        ),
        # recording only: a counter and a byte on a pipe
        (
            "import os, signal\n"
            "class S:\n"
            "    def start(self):\n"
            "        signal.signal(signal.SIGTERM, self._handle)\n"
            "    def _handle(self, signum, frame):\n"
            "        self.count += 1\n"
            "        os.write(self.fd, b'x')\n",
            [],
        ),
    ],
)
def test_the_check_tells_a_recording_handler_from_a_locking_one(tmp_path, source, expected):
    # GIVEN a module with one handler WHEN it is checked
    module = ast.parse(source)
    parents = _Parents()
    parents.visit(module)
    calls = [n for n in ast.walk(module) if isinstance(n, ast.Call)]
    call = next(n for n in calls if _dotted(n.func) == "signal.signal")
    target = call.args[1]
    cls = parents.cls.get(call)
    node = _method(cls, target.attr) if isinstance(target, ast.Attribute) else _function(
        module, target.id
    )
    assert node is not None
    found = violations(Handler(REPO / "x.py", call.lineno, "signal.signal", node, cls, module))
    # THEN each expected problem is named, and a recording handler has none
    assert len(found) >= len(expected)
    for text in expected:
        assert any(text in problem for problem in found), found
    if not expected:
        assert found == []
