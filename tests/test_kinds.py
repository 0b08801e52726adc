"""The kinds of job (tunestudio/kinds.py): one entry each, and everything that starts or shows a job reads it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tunestudio.bench_config import BenchConfig
from tunestudio.config import JobConfig
from tunestudio.export_config import ExportConfig
from tunestudio.jobs.models import CONFIG_TYPES, JobKind
from tunestudio.kinds import KINDS, kind_of_config, spec_of
from tunestudio.make_data_config import MakeDataConfig

from .test_layers import face_of

ROOT = Path(__file__).resolve().parents[1]


def test_every_kind_names_a_recipe_the_child_can_call() -> None:
    """Read with ast (importing a recipe imports torch): the function exists and takes what child.run passes."""
    for spec in KINDS.values():
        module, _, function = spec.recipe.partition(":")
        if (ROOT / module.replace(".", "/") / "__init__.py").is_file():  # a room of worker/: the module its face names
            module = face_of(module)[function] or f"{module}.__init__"
        path = ROOT / (module.replace(".", "/") + ".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
        assert found, f"{spec.name}: {spec.recipe} is not a function of {path}"
        args = found[0].args
        names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
        assert names[:3] == ["config", "channel", "secrets"] and "cache_dir" in names, (spec.name, names)


def test_the_store_and_the_config_types_come_from_the_registry() -> None:
    assert set(CONFIG_TYPES) == set(KINDS) == set(JobKind.__args__)
    assert {name: spec.config for name, spec in KINDS.items()} == CONFIG_TYPES
    assert kind_of_config(JobConfig.model_construct()).name == "train"
    assert kind_of_config(ExportConfig.model_construct()).name == "export"
    assert kind_of_config(BenchConfig.model_construct()).name == "bench"
    with pytest.raises(TypeError, match="config of no kind"):
        kind_of_config(object())
    assert kind_of_config(MakeDataConfig.model_construct()).name == "make_data"
    with pytest.raises(KeyError, match="the kinds are train, export, bench, make_data"):
        spec_of("make-data")


def test_only_a_training_kind_runs_distributed_and_trains() -> None:
    assert [s.name for s in KINDS.values() if s.trains] == ["train"]
    assert [s.name for s in KINDS.values() if s.distributed] == ["train"]
    assert not any(s.about_source and s.trains for s in KINDS.values())
    assert [s.name for s in KINDS.values() if s.about_source] == ["export", "bench"]


def test_the_executor_and_the_child_ask_the_registry() -> None:
    """No kind name is compared in the code that starts a worker: a new kind needs no edit there."""
    from tunestudio.jobs import executor, supervisor
    from tunestudio.worker import child

    for module in (executor, supervisor, child):
        source = inspect.getsource(module)
        for name in KINDS:
            assert f'== "{name}"' not in source and f'!= "{name}"' not in source, (module.__name__, name)


def test_the_api_lists_the_kinds(tmp_path: Path) -> None:
    from tunestudio.api import create_app
    from tunestudio.settings import Settings

    app = create_app(Settings(home=tmp_path / "home", prewarm=False))
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        kinds = client.get("/api/system/kinds").json()
    assert [k["name"] for k in kinds] == list(KINDS)
    assert kinds[0] == {"name": "train", "label": "training job", "trains": True, "distributed": True}
