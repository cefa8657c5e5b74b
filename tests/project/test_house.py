"""benchmarks/house.py: the report on the package has every section, and its rules (import loops,
lines of code per function, upward arrows, rooms, sites) hold on a small package written here.

No figure of the real package is asserted: its files move, and the report is what measures them.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "house.py"


def _load():
    spec = importlib.util.spec_from_file_location("house_benchmark", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=True)


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


@pytest.fixture(scope="module")
def report():
    return json.loads(_run("--json").stdout)


def test_house_json_on_the_package(report):
    assert report["package"] == "blocklin" and report["unparsed"] == []
    assert report["totals"]["files"] > 0 and report["totals"]["lines"] > 0
    assert all(row["folder"].startswith("blocklin") for row in report["folders"])
    longest = report["functions"]["longest"]
    assert longest and longest[0]["lines"] > 0
    assert [f["lines"] for f in longest] == sorted((f["lines"] for f in longest), reverse=True)
    groups = set(report["functions"]["longest_per_group"])
    assert {"cli", "linalg", "runtime", "plan", "device", "storage", "base"} <= groups
    imports = report["imports"]
    for variant in ("module_level", "all"):
        assert imports[variant]["edges"] > 0 and isinstance(imports[variant]["loops"], list)
    assert imports["all"]["edges"] >= imports["module_level"]["edges"]
    assert {"upward", "upward_exempt", "rooms", "layers"} <= set(imports)
    assert set(report["sites"]) == {"resume_identity", "report"}
    assert all(s["count"] == len(s["sites"]) for s in report["sites"].values())
    assert report["bare_raises"]["count"] == len(report["bare_raises"]["sites"])
    assert "line" in report["duplicates"]
    assert len(report["headline"]) == 9


def test_house_text_and_markdown(report):
    house = _load()
    text = house.text_report(report)
    for section in ("1. files per folder", "2. longest function bodies", "3. import loops", "4. sites",
                    "5. bare raises", "6. duplicates"):
        assert section in text
    table = house.markdown_table(report).splitlines()
    assert "| figure | value |" in table and any(line.startswith("| longest function |") for line in table)


def test_lowrank_modules_import_one_way():
    """The modules of ``blocklin.linalg.lowrank`` import one another without a loop, imports inside functions
    included: ``methods`` had imported the SVD's default tolerance from ``svd`` inside ``judged_tol`` (``svd``
    imports ``methods``); it lives below both now (``svd_tolerance``)."""
    house = _load()
    modules = house.load_package(str(ROOT / "blocklin"))
    names = {m.name for m in modules}
    room = "blocklin.linalg.lowrank."
    edges = [e for m in modules if m.name.startswith(room)
             for e in house.import_edges(m, names, "blocklin") if e["dst"].startswith(room)]
    assert [c["edges"] for c in house.loops(edges)] == []


def test_strongly_connected():
    house = _load()
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "d": {"e"}, "e": {"f"}, "f": {"d", "a"}}
    comps = house.strongly_connected(graph)
    assert sorted(c for c in comps if len(c) > 1) == [["a", "b"], ["d", "e", "f"]]
    assert sorted(x for c in comps for x in c) == ["a", "b", "c", "d", "e", "f"]
    # a long chain stays iterative (no recursion limit)
    chain = {str(i): {str(i + 1)} for i in range(5000)}
    chain["5000"] = {"0"}
    assert [len(c) for c in house.strongly_connected(chain)] == [5001]


def test_rules_on_a_small_package(tmp_path):
    pkg = _write(tmp_path, {
        "toy/__init__.py": "from toy.linalg.blocks import a\n",
        "toy/errors.py": "class ToyError(ValueError):\n    pass\n",
        "toy/create.py": "from toy.runtime import c\n",  # may import anything: listed apart
        # a and b import each other at module level: a loop in both variants
        "toy/linalg/__init__.py": "",
        "toy/linalg/blocks/__init__.py": "",
        "toy/linalg/blocks/a.py": '''\
            from toy.linalg.products import b


            def f(x):
                """A docstring
                over two lines."""
                # a comment

                y = x + 1
                return y


            class K:
                def method(self):
                    def inner():
                        return 1
                    return inner()
            ''',
        "toy/linalg/products/__init__.py": "",
        "toy/linalg/products/b.py": '''\
            from ..blocks import a
            from dask.base import tokenize


            def token(x):
                return tokenize(x)


            def report(job, flops):
                out = job.report(flops=flops)
                out["gflops"] = flops / 1e9
                return {"gflops": out["gflops"]}
            ''',
        # c imports d at module level, d imports c in a function: a loop among all imports only
        "toy/runtime/__init__.py": "",
        "toy/runtime/c.py": "from toy.runtime import d\n",
        "toy/runtime/d.py": '''\
            def g():
                from toy.runtime import c
                raise ValueError("bare")
            ''',
        # plan below cli: an upward arrow; a TYPE_CHECKING import is not module-level
        "toy/plan/__init__.py": "",
        "toy/plan/p.py": '''\
            from typing import TYPE_CHECKING

            from toy.cli import main

            if TYPE_CHECKING:
                from toy.runtime import c
            ''',
        "toy/cli/__init__.py": "",
        "toy/cli/main.py": "from toy.errors import ToyError\n",
    }) / "toy"
    report = json.loads(_run("--package", str(pkg), "--json").stdout)
    assert report["package"] == "toy"

    folders = {row["folder"]: row for row in report["folders"]}
    assert folders["toy"]["files"] == 2 and folders["toy"]["init"]
    assert folders["toy/runtime"]["files"] == 2 and report["totals"]["files"] == 8

    lines = {f["qualname"]: f["lines"] for f in report["functions"]["longest"]}
    assert lines["f"] == 2  # docstring, comment and blank line left out
    assert lines["K.method"] == 3 and lines["K.method.<locals>.inner"] == 1  # nested: in its parent and alone
    assert report["functions"]["longest_per_group"]["linalg"]["qualname"] == "K.method"

    imports = report["imports"]
    members = [loop["members"] for loop in imports["module_level"]["loops"]]
    assert members == [["toy.linalg.blocks.a", "toy.linalg.products.b"]]
    members = [loop["members"] for loop in imports["all"]["loops"]]
    assert sorted(members) == [["toy.linalg.blocks.a", "toy.linalg.products.b"], ["toy.runtime.c", "toy.runtime.d"]]
    upward = [(e["src"], e["dst"], e["module_level"]) for e in imports["upward"]]
    assert upward == [("toy.plan.p", "toy.cli.main", True), ("toy.plan.p", "toy.runtime.c", False)]
    assert [(e["src"], e["dst"]) for e in imports["upward_exempt"]] == [("toy.create", "toy.runtime.c")]
    rooms = imports["rooms"]
    assert rooms["subfolders"] == ["linalg.blocks", "linalg.products"]
    assert [loop["members"] for loop in rooms["module_level"]["loops"]] == [["linalg.blocks", "linalg.products"]]

    sites = report["sites"]
    assert sites["resume_identity"]["sites"] == ["toy/linalg/products/b.py:6 tokenize("]
    assert sites["report"]["count"] == 3  # job.report(, out["gflops"] =, {"gflops": ...}
    assert report["bare_raises"]["sites"] == ["toy/runtime/d.py:3 ValueError"]
