"""The floors hold (docs/ARCHITECTURE.md, "Layers"), read from the source with `ast`; nothing is imported.

(a) A room (a top-level module or package of tunestudio) imports only rooms on the floors below its own; the
    rooms of a side-by-side floor reach each other only through a door listed in DOORS.
(b) No two modules import each other (`from package import module` counts as importing the module).
(c) No module imports a private name (`_x`) of another, as `from module import _x` or as `module._x`.
(d) A face imports a wing of the parent's side (FACED) only through the wing's face, its package
    (`from tunestudio.jobs import JobManager`, not `tunestudio.jobs.manager`).

Every import counts, wherever it stands: inside a function and under TYPE_CHECKING too.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tunestudio"

# The floors, top first: docs/ARCHITECTURE.md draws the same picture. A room may import the rooms of the floors
# below its own. On a side-by-side floor the rooms do not import one another (DOORS aside); on the others they
# may, and (b) still refuses a circle.
FLOORS: tuple[tuple[str, frozenset[str], bool], ...] = (
    # name, rooms, side by side
    # cli/: the command line, a module per verb. data_report/: the dataset report for the CLI and the API (its
    # spawned child runs the worker's data code, as api/preview.py's does), imported through its __init__
    ("faces", frozenset({"cli", "api", "data_report"}), False),
    ("wings", frozenset({"jobs", "inference", "worker", "sweeps", "judge"}), True),
    ("base", frozenset({"config", "events", "inference_protocol", "paths", "settings", "process", "checkpoints",
                        "ownership", "export_config", "bench_config", "estimate", "kinds", "openai_client"}), False),
)

# The doors between rooms of a side-by-side floor: (importing room, module it may import). Each is used
# (test_every_door_is_used).
DOORS = {
    # The worker's light entry point: WorkerArgs, WorkerKind, WorkerEntry, PRELOAD and the spawn target `main`.
    # Its own imports at module level are the standard library and base rooms only
    # (test_the_door_to_the_worker_stays_light); the worker's recipes load inside the child.
    ("jobs", "tunestudio.worker.child"),
    # A sweep's trials are ordinary jobs: sweeps/ uses the jobs' public face (the manager, its Job and errors).
    ("sweeps", "tunestudio.jobs.manager"),
}

# The wings a face reaches only through their package's face (__init__ with __all__). The worker is not among
# them: a face runs worker code only in a child it spawns (api/preview.py, data_report/), module by module.
FACED = frozenset({"jobs", "sweeps", "judge", "inference"})

# Violations known today, each to be deleted when fixed (test_known_violations_still_happen says when). None: the
# inference wing came onto the floors in issue 24 (its protocol and process helpers in the base, its worker started
# through the executor seam, its jobs through an interface the faces hand in).
KNOWN: set[str] = set()


@dataclass(frozen=True)
class Import:
    module: str  # the module imported (a package: its __init__)
    name: str | None = None  # the name taken from it, when that is not a module itself


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    found = {}
    for folder, subfolders, files in os.walk(PACKAGE):
        subfolders[:] = [d for d in subfolders if d.isidentifier()]  # not the page's node_modules, not caches
        found.update({module_name(Path(folder, f)): Path(folder, f) for f in files if f.endswith(".py")})
    return dict(sorted(found.items()))


def room(module: str) -> str:
    """tunestudio.worker.data.formats -> worker; tunestudio.cli -> cli."""
    return module.split(".")[1]


def floor_of(name: str) -> int:
    for number, (_, rooms, _) in enumerate(FLOORS):
        if name in rooms:
            return number
    raise AssertionError(f"tunestudio/{name} is on no floor: add it to FLOORS in tests/test_layers.py and to the "
                         "picture in docs/ARCHITECTURE.md")


def owner(dotted: str) -> str | None:
    """The module a dotted name is, or lies in: its longest prefix that is one of ours."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules():
            return ".".join(parts[:end])
    return None


def imports_of(module: str, source: str | None = None) -> list[Import]:
    """Every import of one of our modules in `module`'s source (or in `source`, read as that module's):
    import statements, and `m._x` where `m` is a name an import bound to one of our modules."""
    path = modules().get(module, PACKAGE / "probe.py")
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"), str(path))
    found: list[Import] = []
    bound: dict[str, str] = {}  # a name in this module -> the module of ours it is
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if owner(alias.name) is not None:
                    found.append(Import(owner(alias.name) or ""))
                    if alias.asname and alias.name in modules():
                        bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            for alias in node.names:
                full = f"{origin}.{alias.name}"
                if full in modules():  # `from package import module`, `from tunestudio import paths`
                    found.append(Import(full))
                    bound[alias.asname or alias.name] = full
                elif origin in modules():
                    found.append(Import(origin, alias.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            found.append(Import(bound[node.value.id], node.attr))
    return found


def private(name: str | None) -> bool:
    return name is not None and name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def violations_of(module: str, found: list[Import], edges: dict[str, set[str]]) -> set[str]:
    """What `module` (importing `found`) breaks: floors, circles with the modules in `edges`, private names."""
    broken: set[str] = set()
    here = room(module)
    for target in {i.module for i in found} - {module}:
        there = room(target)
        if there != here:
            mine, theirs = floor_of(here), floor_of(there)
            if theirs < mine or (theirs == mine and FLOORS[mine][2] and (here, target) not in DOORS):
                broken.add(f"{module} -> {target}")
        if module in edges.get(target, set()):
            broken.add(" <-> ".join(sorted((module, target))))
        if floor_of(here) == 0 and there in FACED and target != f"tunestudio.{there}":
            broken.add(f"{module} -> {target} (a face goes through tunestudio.{there})")
    broken |= {f"{module} -> {i.module}.{i.name}" for i in found if private(i.name) and i.module != module}
    return broken


@cache
def imports() -> dict[str, list[Import]]:
    return {m: imports_of(m) for m in modules()}


@cache
def edges() -> dict[str, set[str]]:
    return {m: {i.module for i in found} - {m} for m, found in imports().items()}


def violations() -> set[str]:
    return set().union(*(violations_of(m, found, edges()) for m, found in imports().items()))


def test_every_room_is_on_a_floor() -> None:
    rooms = {room(m) for m in modules()}
    for name in sorted(rooms):
        floor_of(name)
    listed = set().union(*(rooms_ for _, rooms_, _ in FLOORS))
    assert listed <= rooms, f"FLOORS names rooms that are gone: {sorted(listed - rooms)}"


def test_imports_point_down_with_no_circles_and_no_private_names() -> None:
    new = sorted(violations() - KNOWN)
    assert not new, ("imports that break the floors (docs/ARCHITECTURE.md, 'Layers'): A -> B imports upward, "
                     "sideways or a private name; A <-> B import each other:\n  " + "\n  ".join(new))


def test_known_violations_still_happen() -> None:
    gone = sorted(KNOWN - violations())
    assert not gone, "fixed, so delete them from KNOWN in tests/test_layers.py:\n  " + "\n  ".join(gone)


def test_every_door_is_used() -> None:
    used = {(room(m), t) for m, targets in edges().items() for t in targets}
    assert used >= DOORS, f"doors nothing goes through: delete them from DOORS: {sorted(DOORS - used)}"


def test_the_door_to_the_worker_stays_light() -> None:
    """worker/child.py runs in the parent (jobs/ imports it): at module level it imports base rooms only."""
    tree = ast.parse(modules()["tunestudio.worker.child"].read_text(encoding="utf-8"))
    rooms = []
    for node in tree.body:  # module level: what runs when jobs/ imports it
        if isinstance(node, ast.Import):
            rooms += [room(a.name) for a in node.names if a.name.startswith("tunestudio.")]
        elif isinstance(node, ast.ImportFrom) and node.level:
            rooms.append("worker")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tunestudio."):
            rooms.append(room(node.module or ""))
    assert rooms and set(rooms) <= FLOORS[-1][1], rooms


def test_the_scan_sees_each_kind_of_import() -> None:
    """The reader itself, on a module that is not there: relative imports, `from package import module`, an
    import inside a function and under TYPE_CHECKING, a private name taken both ways, a circle, a door."""
    source = """
from typing import TYPE_CHECKING
from . import main
from .model import _from_somewhere, load_model
from .. import ownership
if TYPE_CHECKING:
    from tunestudio.jobs.manager import JobManager
def f():
    from tunestudio.worker.child import WorkerArgs
    import tunestudio.worker.export as export
    return main._hidden, export.run, main.__doc__
"""
    found = imports_of("tunestudio.worker.probe", source)
    assert {i.module for i in found} == {"tunestudio.worker.main", "tunestudio.worker.model", "tunestudio.ownership",
                                         "tunestudio.jobs.manager", "tunestudio.worker.child",
                                         "tunestudio.worker.export"}
    circle = {"tunestudio.worker.export": {"tunestudio.worker.probe"}}
    assert violations_of("tunestudio.worker.probe", found, circle) == {
        "tunestudio.worker.probe -> tunestudio.jobs.manager",  # sideways: the wings stand side by side
        "tunestudio.worker.probe -> tunestudio.worker.model._from_somewhere",
        "tunestudio.worker.probe -> tunestudio.worker.main._hidden",
        "tunestudio.worker.export <-> tunestudio.worker.probe",
    }
    upward = imports_of("tunestudio.config.probe", "import tunestudio.api.deps\nfrom tunestudio.jobs import status")
    assert violations_of("tunestudio.config.probe", upward, {}) == {
        "tunestudio.config.probe -> tunestudio.api.deps", "tunestudio.config.probe -> tunestudio.jobs.status"}
    faced = imports_of("tunestudio.api.probe", "from tunestudio.jobs.manager import JobManager\n"
                                               "from tunestudio.jobs import JobStatus")
    assert violations_of("tunestudio.api.probe", faced, {}) == {
        "tunestudio.api.probe -> tunestudio.jobs.manager (a face goes through tunestudio.jobs)"}
    door = "from tunestudio.worker.child import PRELOAD"
    assert violations_of("tunestudio.jobs.probe", imports_of("tunestudio.jobs.probe", door), {}) == set()
    assert violations_of("tunestudio.inference.probe", imports_of("tunestudio.inference.probe", door), {}) == {
        "tunestudio.inference.probe -> tunestudio.worker.child"}  # the door is jobs/' alone
