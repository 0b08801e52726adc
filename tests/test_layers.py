"""The floors hold (docs/ARCHITECTURE.md, "Layers"), read from the source with `ast`; nothing is imported.

(a) A room (a top-level module or package of tunestudio) imports only rooms on the floors below its own; the
    rooms of a side-by-side floor reach each other only through a door listed in DOORS.
(b) No two modules import each other (`from package import module` counts as importing the module).
(c) No module imports a private name (`_x`) of another, as `from module import _x` or as `module._x`.
(d) Inside worker/ the same holds one level down (WORKER_FLOORS): its rooms (packages) and loose modules import
    only down; and a room is reached from outside it, worker/ or not, only through its face (the package's
    `__init__`), for a name the face gives.
(e) A face imports a wing of the parent's side (FACED) only through the wing's face, its package
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
    # child, forked from the warm worker forkserver or spawned, runs the worker's data code, as api/preview.py's
    # does), imported through its __init__
    ("faces", frozenset({"cli", "api", "data_report"}), False),
    ("wings", frozenset({"jobs", "inference", "worker", "sweeps", "judge", "arena"}), True),
    ("base", frozenset({"config", "events", "inference_protocol", "paths", "settings", "process", "checkpoints",
                        "ownership", "export_config", "bench_config", "bench_tasks", "estimate", "estimate_vision",
                        "kinds", "openai_client", "make_data_config", "make_data_preview",
                        "chat_rows", "tool_calls", "transcripts"}), False),
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
    # The arena asks the judge about voted pairs (both orders, as a judgement does) and reads its Wilson interval.
    ("arena", "tunestudio.judge"),
}

# The wings a face reaches only through their package's face (__init__ with __all__). The worker is not among
# them: a face runs worker code only in a child it starts (api/preview.py, data_report/: a fork of the warm worker
# forkserver or a spawned interpreter), and there through a worker room's face, as (d) says.
FACED = frozenset({"jobs", "sweeps", "judge", "inference", "arena"})

# The floors inside worker/ (issue 39), top first, read as FLOORS is: its rooms, each a package whose `__init__` is
# its face (`__all__`, or a lazy face's `_FACE`: tunestudio.worker.lazy_face), and its loose modules.
WORKER = "tunestudio.worker"
WORKER_FLOORS: tuple[tuple[str, frozenset[str], bool], ...] = (
    # a job on a Ray cluster: its driver and its ranks run main's recipe; started as a process, imported by none
    ("ray", frozenset({"ray"}), False),
    # what a process starts with: the recipes (main: training, bench), the child's door, `python -m
    # tunestudio.worker`, the torchrun launcher and rank, the tiny model's maker (tunestudio make-tiny-model)
    ("entries", frozenset({"__main__", "main", "bench", "child", "launch", "rank", "tiny", "tiny_methods",
                            "tiny_tools", "tiny_vision", "tiny_images", "tiny_docs", "tiny_rewards",
                            "tiny_audio"}), False),
    # the chat worker, and the export recipe (which loads a base model through train/'s face)
    ("wings", frozenset({"serve", "export", "make_data"}), True),
    # one object per kind of data: loads, prepares and scores through train/ and data/
    ("modalities", frozenset({"modalities"}), False),
    ("train", frozenset({"train"}), False),
    ("data", frozenset({"data"}), False),
    # what every room stands on (__init__: worker/'s own, lazy_face); rewards here, not in train/, because data/
    # checks a GRPO row's answer with it; converter here because export/ and serve/ (llama.cpp's copies) both run it
    ("ground", frozenset({"__init__", "channel", "converter", "errors", "hub", "optional", "phases", "resources",
                          "rewards"}),
     False),
)

# Violations known today, each to be deleted when fixed (test_known_violations_still_happen says when). The inference
# wing came onto the floors in issue 24; the last, modules of data/ reached past its face, went in issue 39.
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


def floor_of(name: str, floors: tuple[tuple[str, frozenset[str], bool], ...] = FLOORS) -> int:
    for number, (_, rooms, _) in enumerate(floors):
        if name in rooms:
            return number
    where, table = ("tunestudio/worker/", "WORKER_FLOORS") if floors is WORKER_FLOORS else ("tunestudio/", "FLOORS")
    raise AssertionError(f"{where}{name} is on no floor: add it to {table} in tests/test_layers.py and to the "
                         "picture in docs/ARCHITECTURE.md")


def above_or_beside(floors: tuple[tuple[str, frozenset[str], bool], ...], here: str, there: str) -> bool:
    """Whether room `here` may not import room `there`: it stands on a higher floor, or beside it."""
    mine, theirs = floor_of(here, floors), floor_of(there, floors)
    return theirs < mine or (theirs == mine and floors[mine][2])


def worker_room(module: str) -> str | None:
    """tunestudio.worker.train.model -> train; tunestudio.worker.main -> main; tunestudio.worker -> __init__;
    None outside worker/."""
    if module == WORKER:
        return "__init__"
    return module.split(".")[2] if module.startswith(f"{WORKER}.") else None


@cache
def faces() -> dict[str, dict[str, str | None]]:
    """Each room of worker/ (a package) and what its face gives: name -> the module defining it (None: the face)."""
    return {m.split(".")[2]: face_of(m) for m, path in modules().items()
            if m.count(".") == 2 and m.startswith(f"{WORKER}.") and path.name == "__init__.py"}


def face_of(package: str, source: str | None = None) -> dict[str, str | None]:
    """The names a face gives: its `_FACE` (module -> names, a lazy face), else its `__all__`, written out."""
    tree = ast.parse(source if source is not None else modules()[package].read_text(encoding="utf-8"))
    assigned = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(target, ast.Name) and node.value:
            assigned[target.id] = node.value
    if "_FACE" in assigned:
        return {name: f"{package}.{module}" for module, names in ast.literal_eval(assigned["_FACE"]).items()
                for name in names}
    if isinstance(assigned.get("__all__"), (ast.List, ast.Tuple)):
        return dict.fromkeys(ast.literal_eval(assigned["__all__"]))
    raise AssertionError(f"{package} has no face: write its __all__ (or a lazy face's _FACE)")


def defined(module: str) -> set[str]:
    """The names `module` binds at its top level (under if/try too)."""
    names: set[str] = set()
    body = list(ast.parse(modules()[module].read_text(encoding="utf-8")).body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.If, ast.Try)):
            body += [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                     *(n for h in getattr(node, "handlers", []) for n in h.body)]
    return names


def face_gaps(package: str, source: str | None = None) -> set[str]:
    """Names a face gives that the module it names (the face itself for an `__all__`) does not define."""
    gaps = set()
    for name, home in face_of(package, source).items():
        where = home or package
        if where not in modules() or name not in defined(where):
            gaps.add(f"{package}.{name}")
    return gaps


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
        if (module.startswith("tunestudio.api.") and not module.startswith("tunestudio.api.routes")
                and target.startswith("tunestudio.api.routes")):
            broken.add(f"{module} -> {target} (api/'s modules stand below its routes)")
        if floor_of(here) == 0 and there in FACED and target != f"tunestudio.{there}":
            broken.add(f"{module} -> {target} (a face goes through tunestudio.{there})")
    broken |= {f"{module} -> {i.module}.{i.name}" for i in found if private(i.name) and i.module != module}
    return broken | worker_violations_of(module, found)


def worker_violations_of(module: str, found: list[Import]) -> set[str]:
    """(d): what `module` breaks of worker/'s inner floors, and of its rooms' faces."""
    broken: set[str] = set()
    here = worker_room(module)
    for i in found:
        there = worker_room(i.module)
        if there is None or there == here or i.module == module:
            continue
        if here is not None and above_or_beside(WORKER_FLOORS, here, there):
            broken.add(f"{module} -> {i.module}")
        if there in faces():
            if i.module != f"{WORKER}.{there}":  # past the face: a module of the room
                broken.add(f"{module} -> {i.module}")
            elif i.name is not None and i.name not in faces()[there]:
                broken.add(f"{module} -> {i.module}.{i.name}")
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


def test_every_room_of_the_worker_is_on_a_floor_and_has_a_face() -> None:
    inner = {worker_room(m) or "" for m in modules() if m.startswith(WORKER)}
    for name in sorted(inner):
        floor_of(name, WORKER_FLOORS)
    listed = set().union(*(rooms_ for _, rooms_, _ in WORKER_FLOORS))
    assert listed <= inner, f"WORKER_FLOORS names rooms that are gone: {sorted(listed - inner)}"
    assert set(faces()) == {"data", "export", "make_data", "modalities", "ray", "serve", "train"}
    gaps = set().union(*(face_gaps(f"{WORKER}.{name}") for name in faces()))
    assert not gaps, f"faces give names their rooms do not define: {sorted(gaps)}"


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
    """The reader itself, on a source that is not there (read as worker/rank.py): relative imports, `from package
    import module`, an import inside a function and under TYPE_CHECKING, a private name taken both ways, a circle,
    a door."""
    source = """
from typing import TYPE_CHECKING
from . import main
from .hub import _from_somewhere, load_model
from .. import ownership
if TYPE_CHECKING:
    from tunestudio.jobs.manager import JobManager
def f():
    from tunestudio.worker.child import WorkerArgs
    import tunestudio.worker.export as export
    return main._hidden, export.run, main.__doc__
"""
    found = imports_of("tunestudio.worker.rank", source)  # a loose module of worker/: on its floors
    assert {i.module for i in found} == {"tunestudio.worker.main", "tunestudio.worker.hub", "tunestudio.ownership",
                                         "tunestudio.jobs.manager", "tunestudio.worker.child",
                                         "tunestudio.worker.export"}
    circle = {"tunestudio.worker.export": {"tunestudio.worker.rank"}}
    assert violations_of("tunestudio.worker.rank", found, circle) == {
        "tunestudio.worker.rank -> tunestudio.jobs.manager",  # sideways: the wings stand side by side
        "tunestudio.worker.rank -> tunestudio.worker.hub._from_somewhere",
        "tunestudio.worker.rank -> tunestudio.worker.main._hidden",
        "tunestudio.worker.export <-> tunestudio.worker.rank",
    }
    upward = imports_of("tunestudio.config.probe", "import tunestudio.api.deps\nfrom tunestudio.jobs import status")
    assert violations_of("tunestudio.config.probe", upward, {}) == {
        "tunestudio.config.probe -> tunestudio.api.deps", "tunestudio.config.probe -> tunestudio.jobs.status"}
    faced = imports_of("tunestudio.api.probe", "from tunestudio.jobs.manager import JobManager\n"
                                               "from tunestudio.jobs import JobStatus")
    assert violations_of("tunestudio.api.probe", faced, {}) == {
        "tunestudio.api.probe -> tunestudio.jobs.manager (a face goes through tunestudio.jobs)"}
    upward = imports_of("tunestudio.api.probe", "from tunestudio.api.routes.openai import OpenAIRoute")
    assert violations_of("tunestudio.api.probe", upward, {}) == {
        "tunestudio.api.probe -> tunestudio.api.routes.openai (api/'s modules stand below its routes)"}
    door = "from tunestudio.worker.child import PRELOAD"
    assert violations_of("tunestudio.jobs.probe", imports_of("tunestudio.jobs.probe", door), {}) == set()
    assert violations_of("tunestudio.inference.probe", imports_of("tunestudio.inference.probe", door), {}) == {
        "tunestudio.inference.probe -> tunestudio.worker.child"}  # the door is jobs/' alone


def test_the_scan_sees_the_worker_floors_and_faces() -> None:
    """(d) on sources that are not there, read as modules of worker/ and api/: past a face (a module of the room,
    `from room import module`, a name the face does not give; from inside worker/ and from outside it), up a worker
    floor, beside it; a room's own modules reach each other freely. And a face giving a name its module lacks."""
    def broken(module: str, source: str) -> set[str]:
        return violations_of(module, imports_of(module, source), {})

    past = """
from tunestudio.worker.train import build_trainer
from tunestudio.worker.train.model import load_model
from tunestudio.worker import train
from tunestudio.worker.export import gguf
def f():
    return train.prepare_model, train.not_on_the_face
"""
    assert broken("tunestudio.worker.main", past) == {
        "tunestudio.worker.main -> tunestudio.worker.train.model",
        "tunestudio.worker.main -> tunestudio.worker.export.gguf",
        "tunestudio.worker.main -> tunestudio.worker.train.not_on_the_face",
    }
    assert broken("tunestudio.api.probe", "from tunestudio.worker.serve.generation import Models") == {
        "tunestudio.api.probe -> tunestudio.worker.serve.generation"}  # outside worker/ too
    up = "from tunestudio.worker.train.model import load_model\nfrom tunestudio.worker import modalities, serve"
    assert broken("tunestudio.worker.train.probe", up) == {  # its own room's module is its own business
        "tunestudio.worker.train.probe -> tunestudio.worker.modalities",
        "tunestudio.worker.train.probe -> tunestudio.worker.serve",
    }
    assert broken("tunestudio.worker.serve.probe", "from tunestudio.worker.export import run") == {
        "tunestudio.worker.serve.probe -> tunestudio.worker.export"}  # the wings inside stand side by side too
    from_ground = "from tunestudio.worker.data import prepare\nimport tunestudio.worker.main"
    assert broken("tunestudio.worker.hub", from_ground) == {  # the ground imports no room
        "tunestudio.worker.hub -> tunestudio.worker.data", "tunestudio.worker.hub -> tunestudio.worker.main"}
    assert broken("tunestudio.worker.export.probe", "from tunestudio.worker.train import from_pretrained") == set()
    face = '_FACE = {"model": ("load_model", "no_such_name")}'
    assert face_gaps("tunestudio.worker.train", face) == {"tunestudio.worker.train.no_such_name"}
    assert face_gaps("tunestudio.worker.data", '__all__ = ["prepare", "gone"]') == {"tunestudio.worker.data.gone"}
