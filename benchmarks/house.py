"""House measurements: the package's structure, measured by one script so that the figures of the
"Measured" table in ``docs/architecture.md`` are produced, not copied.

Usage::

    python benchmarks/house.py [--package blocklin] [--json | --markdown]

``--package`` takes a package folder, relative to the current folder or to the repository root
(default ``blocklin``); the package's name is the folder's name. The script only reads the
source (``ast``): nothing is imported or written. Printed: a text report by default, a markdown
table of the headline figures with ``--markdown``, one JSON object with everything with ``--json``.

What is measured, and the rules:

1. **Files per folder.** For each folder holding ``.py`` files: the number of modules (``.py``
   files other than ``__init__.py``, which is noted apart) and the total lines of all its ``.py``
   files, ``__init__.py`` included. Subfolders count as folders of their own.
2. **Longest function bodies.** Lines of code of every function and method: the lines from the
   first statement after the docstring (from its first decorator, for a decorated statement) to the
   function's last line, less blank lines and comment-only lines. A nested function counts inside
   its parent and is also listed on its own (``outer.<locals>.inner``). The top ``TOP`` of the
   package, and the longest of each top-level group (a subpackage, or ``base`` for the modules
   directly in the package).
3. **Import loops.** The graph of imports between the package's modules: ``import pkg.x``,
   ``from pkg.x import y`` and relative imports; ``from pkg import name`` is an import of the module
   ``pkg.name`` where that is a module, else of ``pkg`` (its ``__init__``). Parent packages are not
   counted as imported. Two variants: module-level imports (run when the module is imported: not
   inside a function, not under ``if TYPE_CHECKING:``) and all imports. Loops are the strongly
   connected components of more than one module (Tarjan). **Upward arrows**: an import from a
   group with a lower number in ``LAYERS`` to one with a higher number (all imports; the package
   itself, whose ``__init__`` imports every layer, stands above them all). The modules in
   ``MAY_IMPORT_ANYTHING`` (the public surface) are listed apart, as information. Inside
   ``ROOMS_IN`` (``linalg``), where it has subfolders, the same graph between its rooms: each
   subfolder is a room, the modules directly in the folder form one room and its ``__init__``
   another.
4. **Sites.** Calls and dict keys matching ``SITE_PATTERNS``: the places that build a resume
   identity (``tokenize(...)``, functions named ``*resume_token*`` or ``*identity*``) and the
   places that build a report (``.report(...)``, ``{"gflops": ...}`` and ``x["gflops"] = ...``).
5. **Bare raises.** ``raise`` of a built-in exception in ``BARE_EXCEPTIONS`` (the project's own
   errors live in ``errors.py``).
6. **Duplicates.** The first line of ``duplicates --repo <package folder> --most 200`` (the count of
   pairs of places sharing runs of 6 or more lines), where that command is on PATH.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: How many of the longest functions are listed.
TOP = 10
#: Layers, from top to bottom; an import from a lower number to a higher one is an upward arrow.
#: ``base`` is the modules directly in the package (``config``, ``errors``, ``validate``, ...).
LAYERS = {"cli": 5, "linalg": 4, "runtime": 3, "storage": 2, "device": 2, "plan": 1, "base": 0}
#: The package itself (its ``__init__``, which imports every layer) stands above all layers.
ROOT_LAYER = max(LAYERS.values()) + 1
#: Base modules that may import any layer (the public surface); their upward imports are listed
#: as information only. ``__init__`` is the package's own ``__init__.py``.
MAY_IMPORT_ANYTHING = ("__init__", "demo", "create", "matrix", "sparse", "operands")
#: The group whose subfolders (rooms) get an import graph of their own.
ROOMS_IN = "linalg"
#: What counts as a site, by kind. ``call_names``: a call of that name (``f(...)`` or ``x.f(...)``);
#: ``call_name_contains``: a call whose name contains one of these, less ``call_name_excludes``;
#: ``method_calls``: ``x.name(...)`` only; ``dict_keys``: a key in a dict literal or a subscript
#: assignment (``x["key"] = ...``); ``exclude_paths``: files (path endings) not searched for that kind.
SITE_PATTERNS = {
    "resume_identity": {
        "title": "places that build a resume identity",
        # the hashes a token is made of; callers of the one builder (resume_token) are not builders
        "call_names": ("tokenize", "sha1", "sha256", "md5"),
        "call_name_contains": (),
        "call_name_excludes": (),
        "method_calls": (),
        "dict_keys": (),
        # task keys and graph names: tokens of a graph, not of a run's result
        "exclude_paths": ("runtime/graph.py", "runtime/passes.py"),
    },
    "report": {
        "title": "places that build a report",
        "call_names": (),
        "call_name_contains": (),
        "call_name_excludes": (),
        "method_calls": ("report",),
        "dict_keys": ("gflops",),
    },
}
#: Built-in exceptions that should be one of the project's errors where raised.
BARE_EXCEPTIONS = ("ValueError", "TypeError", "RuntimeError", "KeyError")
#: The duplicates command and its arguments after ``--repo <folder>``.
DUPLICATES = ("duplicates", "--most", "200")

RULES = {
    "files": "modules per folder: .py files other than __init__.py (+init where the folder has one); "
             "lines: every line of the folder's own .py files, __init__.py included",
    "functions": "lines of code: from the first statement after the docstring to the function's end, "
                 "less blank and comment-only lines; nested functions count in their parent and on their own",
    "imports": "edges between the package's modules; from pkg import name imports pkg.name where that is a "
               "module, else pkg; module-level: not in a function, not under if TYPE_CHECKING",
    "upward": "an import (any, lazy included) from a lower layer to a higher one; layers: "
              + ", ".join(f"{g} {n}" for g, n in sorted(LAYERS.items(), key=lambda kv: -kv[1]))
              + f", the package itself {ROOT_LAYER}; "
              + ", ".join(f"{m}.py" for m in MAY_IMPORT_ANYTHING) + " may import anything",
    "bare_raises": "raise " + " / ".join(BARE_EXCEPTIONS) + " (the project's errors live in errors.py)",
}


class Module(NamedTuple):
    """One source file of the package.

    Attributes
    ----------
    name : str
        Dotted module name (``blocklin.linalg.operator``; a package's ``__init__`` is the package).
    path : str
        Path relative to the package folder's parent (``blocklin/linalg/operator.py``).
    is_package : bool
        Whether the file is an ``__init__.py``.
    lines : list of str
        The file's lines.
    tree : ast.Module or None
        The parsed file; None where it does not parse (reported under ``unparsed``).
    """

    name: str
    path: str
    is_package: bool
    lines: list
    tree: ast.Module | None


def load_package(folder: str) -> list[Module]:
    """Read and parse every ``.py`` file below ``folder``.

    Parameters
    ----------
    folder : str
        The package folder; its name is the package's name.

    Returns
    -------
    list of Module
        Sorted by path.
    """
    base = os.path.dirname(folder)
    modules = []
    for here, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        for fname in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(here, fname)
            rel = os.path.relpath(path, base)
            parts = rel[:-3].split(os.sep)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            with open(path, encoding="utf-8") as f:
                text = f.read()
            try:
                tree = ast.parse(text, filename=rel)
            except SyntaxError:
                tree = None
            modules.append(Module(".".join(parts), rel.replace(os.sep, "/"), is_package, text.splitlines(), tree))
    return modules


def group_of(mod: str, packages: set[str]) -> str:
    """The top-level group of a module: its subpackage under the root, ``base``, or the root.

    Parameters
    ----------
    mod : str
        Dotted module name.
    packages : set of str
        Dotted names of the package's packages (folders with an ``__init__.py`` or modules below).

    Returns
    -------
    str
        ``"cli"``, ``"linalg"``, ... for a module in a subpackage, ``"base"`` for a module directly
        in the package, ``""`` for the package itself.
    """
    parts = mod.split(".")
    if len(parts) == 1:
        return ""
    if len(parts) > 2 or mod in packages:
        return parts[1]
    return "base"


# -- 1. files per folder ---------------------------------------------------------------------------

def count_folders(modules: list[Module]) -> list[dict]:
    """Modules and lines per folder (see ``RULES["files"]``)."""
    folders: dict[str, dict] = {}
    for m in modules:
        folder, _, fname = m.path.rpartition("/")
        row = folders.setdefault(folder, {"folder": folder, "files": 0, "init": False, "lines": 0})
        row["lines"] += len(m.lines)
        if fname == "__init__.py":
            row["init"] = True
        else:
            row["files"] += 1
    return [folders[k] for k in sorted(folders)]


# -- 2. function lengths ---------------------------------------------------------------------------

def code_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> int:
    """Lines of code in a function's body, without its docstring, blank lines and comment-only lines.

    Parameters
    ----------
    fn : ast.FunctionDef or ast.AsyncFunctionDef
        The function.
    lines : list of str
        The lines of its file.

    Returns
    -------
    int
        The count; 0 for a function that is only a docstring.
    """
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if not body:
        return 0
    first = body[0]
    start = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", [])])
    count = 0
    for line in lines[start - 1:fn.end_lineno]:
        text = line.strip()
        if text and not text.startswith("#"):
            count += 1
    return count


def function_lengths(mod: Module) -> list[dict]:
    """Every function and method of a module with its lines of code.

    Returns
    -------
    list of dict
        ``module``, ``qualname`` (``Class.method``, ``outer.<locals>.inner``), ``path``, ``line`` and
        ``lines`` (lines of code).
    """
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qual = prefix + child.name
                out.append({"module": mod.name, "qualname": qual, "path": mod.path, "line": child.lineno,
                            "lines": code_lines(child, mod.lines)})
                visit(child, qual + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    if mod.tree is not None:
        visit(mod.tree, "")
    return out


# -- 3. import graph -------------------------------------------------------------------------------

def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_edges(mod: Module, names: set[str], package: str) -> list[dict]:
    """The imports of one module that land in the package.

    Parameters
    ----------
    mod : Module
        The importing module.
    names : set of str
        Dotted names of all the package's modules.
    package : str
        The package's name.

    Returns
    -------
    list of dict
        ``src``, ``dst`` (dotted names), ``path`` (the importing file), ``line`` and ``module_level``
        (False inside a function or under ``if TYPE_CHECKING:``). Imports of the module itself are
        left out.
    """
    edges = []

    def resolve(name: str) -> str | None:
        # the longest prefix of ``name`` that is a module of the package
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name or None

    def inside(name: str | None) -> bool:
        return bool(name) and (name == package or name.startswith(package + "."))

    def record(node: ast.Import | ast.ImportFrom, lazy: bool) -> None:
        targets = []
        if isinstance(node, ast.Import):
            targets = [resolve(a.name) for a in node.names if inside(a.name)]
        else:
            if node.level:
                anchor = mod.name if mod.is_package else mod.name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                where = f"{anchor}.{node.module}" if node.module else anchor
            else:
                where = node.module or ""
            if not inside(where):
                return
            for alias in node.names:
                sub = f"{where}.{alias.name}"
                targets.append(sub if sub in names else resolve(where))
        for dst in targets:
            if dst and dst != mod.name:
                edges.append({"src": mod.name, "dst": dst, "path": mod.path, "line": node.lineno,
                              "module_level": not lazy})

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            record(node, lazy)
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, lazy)
            return
        lazy = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, lazy)

    if mod.tree is not None:
        visit(mod.tree, False)
    return edges


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of a directed graph (Tarjan, iterative).

    Parameters
    ----------
    graph : dict of str to set of str
        Each node's successors; successors that are not keys are nodes without edges.

    Returns
    -------
    list of list of str
        Every component, each sorted; singletons included.
    """
    nodes = set(graph) | {w for succ in graph.values() for w in succ}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(nodes):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(graph.get(root, ()))))]
        while work:
            v, succ = work[-1]
            for w in succ:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    out.append(sorted(comp))
    return out


def loops(edges: list[dict], key=lambda name: name) -> list[dict]:
    """Import loops: components of more than one node, with the edges inside each.

    Parameters
    ----------
    edges : list of dict
        Import edges (``src``, ``dst``, ``path``, ``line``, ``module_level``).
    key : callable, optional
        Maps a module to its node (a room, for the rooms' graph); edges within one node are dropped.

    Returns
    -------
    list of dict
        ``members`` (sorted) and ``edges`` (``"src -> dst (path:line, ...)"``), largest first.
    """
    graph: dict[str, set[str]] = {}
    lines: dict[tuple[str, str], list[str]] = {}
    for e in edges:
        a, b = key(e["src"]), key(e["dst"])
        if a is None or b is None or a == b:
            continue
        graph.setdefault(a, set()).add(b)
        where = f"{e['path']}:{e['line']}"
        if where not in lines.setdefault((a, b), []):  # one per statement, not per imported name
            lines[a, b].append(where)
    out = []
    for comp in strongly_connected(graph):
        if len(comp) < 2:
            continue
        inner = set(comp)
        out.append({"members": comp, "edges": [f"{a} -> {b} ({', '.join(lines[a, b])})"
                                               for (a, b) in sorted(lines) if a in inner and b in inner]})
    return sorted(out, key=lambda c: (-len(c["members"]), c["members"]))


def upward_arrows(edges: list[dict], package: str, packages: set[str]) -> tuple[list[dict], list[dict], list[str]]:
    """Imports from a lower layer to a higher one.

    Returns
    -------
    upward : list of dict
        ``src``, ``dst``, ``path``, ``line``, ``module_level``, ``from`` and ``to`` (the groups); one per pair
        of modules (its first import, module-level if any is).
    exempt : list of dict
        The same for the modules that may import anything.
    unlayered : list of str
        Groups that ``LAYERS`` does not name (their imports are not judged).
    """
    def layer(mod: str) -> tuple[str, int | None]:
        group = group_of(mod, packages)
        return (group or package), (ROOT_LAYER if not group else LAYERS.get(group))

    pairs: dict[tuple[str, str], dict] = {}
    for e in edges:
        row = pairs.get((e["src"], e["dst"]))
        if row is None or (e["module_level"] and not row["module_level"]):
            pairs[e["src"], e["dst"]] = e
    upward, exempt, unlayered = [], [], set()
    for (src, dst), e in sorted(pairs.items()):
        (g_src, n_src), (g_dst, n_dst) = layer(src), layer(dst)
        for g, n in ((g_src, n_src), (g_dst, n_dst)):
            if n is None:
                unlayered.add(g)
        if n_src is None or n_dst is None or n_src >= n_dst:
            continue
        row = dict(e, **{"from": g_src, "to": g_dst})
        free = src == package or (g_src == "base" and src.rpartition(".")[2] in MAY_IMPORT_ANYTHING)
        (exempt if free else upward).append(row)
    return upward, exempt, sorted(unlayered)


def room_of(mod: str, package: str, packages: set[str]) -> str | None:
    """The room of a module inside ``ROOMS_IN``, or None for a module outside it.

    Each subfolder is a room (``linalg.blocks``), the modules directly in the folder form the room
    ``linalg`` and the folder's ``__init__`` the room ``linalg.__init__``.
    """
    parts = mod.split(".")
    if parts[:2] != [package, ROOMS_IN]:
        return None
    if len(parts) == 2:
        return f"{ROOMS_IN}.__init__"
    if len(parts) > 3 or mod in packages:
        return f"{ROOMS_IN}.{parts[2]}"
    return ROOMS_IN


def rooms(edges: list[dict], modules: list[Module], package: str, packages: set[str]) -> dict:
    """The import graph between the rooms of ``ROOMS_IN``, in both variants."""
    names = sorted({room_of(m.name, package, packages) for m in modules} - {None})
    subfolders = [r for r in names if r not in (ROOMS_IN, f"{ROOMS_IN}.__init__")]
    out: dict = {"folder": ROOMS_IN, "rooms": names if subfolders else [], "subfolders": subfolders}
    if not subfolders:
        return out

    def key(mod: str) -> str | None:
        return room_of(mod, package, packages)

    for variant, chosen in (("module_level", [e for e in edges if e["module_level"]]), ("all", edges)):
        counts: dict[str, int] = {}
        for e in chosen:
            a, b = key(e["src"]), key(e["dst"])
            if a and b and a != b:
                counts[f"{a} -> {b}"] = counts.get(f"{a} -> {b}", 0) + 1
        out[variant] = {"edges": dict(sorted(counts.items())), "loops": loops(chosen, key)}
    return out


# -- 4, 5. sites and bare raises -------------------------------------------------------------------

def _call_name(call: ast.Call) -> tuple[str | None, bool]:
    # the called name and whether it is a method call (x.name(...))
    if isinstance(call.func, ast.Name):
        return call.func.id, False
    if isinstance(call.func, ast.Attribute):
        return call.func.attr, True
    return None, False


def _key(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def find_sites(mod: Module) -> dict[str, list[str]]:
    """Sites matching ``SITE_PATTERNS`` in one module.

    Returns
    -------
    dict of str to list of str
        For each kind, ``"path:line what"`` per site.
    """
    found: dict[str, list] = {kind: [] for kind in SITE_PATTERNS}  # (line, site) until sorted
    if mod.tree is None:
        return found
    for node in ast.walk(mod.tree):
        for kind, p in SITE_PATTERNS.items():
            what = None
            if any(mod.path.endswith(x) for x in p.get("exclude_paths", ())):
                continue
            if isinstance(node, ast.Call):
                name, method = _call_name(node)
                if name is None or name in p["call_name_excludes"]:
                    continue
                if name in p["call_names"] or any(s in name for s in p["call_name_contains"]):
                    what = f"{'.' if method else ''}{name}("
                elif method and name in p["method_calls"]:
                    what = f".{name}("
            elif isinstance(node, ast.Dict):
                keys = [k for k in map(_key, node.keys) if k in p["dict_keys"]] if node.keys else []
                what = f'{{"{keys[0]}": ...}}' if keys else None
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                keys = [_key(t.slice) for t in targets if isinstance(t, ast.Subscript)]
                keys = [k for k in keys if k in p["dict_keys"]]
                what = f'["{keys[0]}"] =' if keys else None
            if what:
                found[kind].append((node.lineno, f"{mod.path}:{node.lineno} {what}"))
    return {kind: [s for _, s in sorted(rows)] for kind, rows in found.items()}


def bare_raises(mod: Module) -> list[str]:
    """``raise`` statements of a built-in exception in ``BARE_EXCEPTIONS``: ``"path:line Name"``."""
    out = []
    if mod.tree is None:
        return out
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in BARE_EXCEPTIONS:
                out.append((node.lineno, f"{mod.path}:{node.lineno} {exc.id}"))
    return [s for _, s in sorted(out)]


# -- 6. duplicates ---------------------------------------------------------------------------------

def duplicates(folder: str) -> dict:
    """The first line of the ``duplicates`` command on the package folder, where it is installed.

    Returns
    -------
    dict
        ``installed``, ``line`` (its first line, or why there is none) and ``pairs`` (the count it
        starts with, 0 for ``no duplicates``, None where not known).
    """
    exe = shutil.which(DUPLICATES[0])
    if exe is None:
        return {"installed": False, "line": "duplicates: not installed here", "pairs": None}
    try:
        run = subprocess.run([exe, "--repo", folder, *DUPLICATES[1:]], check=False, capture_output=True, text=True,
                             timeout=120)
    except subprocess.TimeoutExpired:
        return {"installed": True, "line": "duplicates: gave no answer within 120 s", "pairs": None}
    line = (run.stdout.splitlines() or [f"duplicates: no output (exit {run.returncode})"])[0]
    head = line.split()[0] if line.split() else ""
    pairs = int(head) if head.isdigit() else 0 if line.startswith("no duplicates") else None
    return {"installed": True, "line": line, "pairs": pairs}


# -- the measurement -------------------------------------------------------------------------------

def _commit(folder: str) -> str | None:
    # the checkout's commit, "+changes" where the package folder differs from it
    try:
        head = subprocess.run(["git", "-C", folder, "rev-parse", "--short", "HEAD"], check=False,
                              capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", folder, "status", "--porcelain", "--", "."], check=False,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + (" +changes" if dirty.stdout.strip() else "")


def measure(folder: str) -> dict:
    """Everything the script reports, for one package folder.

    Parameters
    ----------
    folder : str
        The package folder.

    Returns
    -------
    dict
        The JSON object ``--json`` prints; ``headline`` holds the figures ``--markdown`` prints.
    """
    folder = os.path.abspath(folder)
    package = os.path.basename(folder)
    modules = load_package(folder)
    names = {m.name for m in modules}
    packages = {m.name for m in modules if m.is_package}

    folders = count_folders(modules)
    functions = sorted((f for m in modules for f in function_lengths(m)),
                       key=lambda f: (-f["lines"], f["module"], f["qualname"]))
    per_group: dict[str, dict] = {}
    for f in functions:
        per_group.setdefault(group_of(f["module"], packages) or package, f)

    edges = [e for m in modules for e in import_edges(m, names, package)]
    module_level = [e for e in edges if e["module_level"]]
    upward, exempt, unlayered = upward_arrows(edges, package, packages)
    sites = {kind: [] for kind in SITE_PATTERNS}
    for m in modules:
        for kind, rows in find_sites(m).items():
            sites[kind].extend(rows)
    raises = [r for m in modules for r in bare_raises(m)]
    dup = duplicates(folder)

    out = {
        "package": package,
        "folder": folder,
        "commit": _commit(folder),
        "rules": RULES,
        "unparsed": [m.path for m in modules if m.tree is None],
        "folders": folders,
        "totals": {"folders": len(folders), "files": sum(r["files"] for r in folders),
                   "lines": sum(r["lines"] for r in folders)},
        "functions": {"count": len(functions), "longest": functions[:TOP], "longest_per_group": per_group},
        "imports": {
            "modules": len(names),
            "module_level": {"edges": len(module_level), "loops": loops(module_level)},
            "all": {"edges": len(edges), "loops": loops(edges)},
            "layers": dict(LAYERS, **{package: ROOT_LAYER}),
            "upward": upward,
            "may_import_anything": [f"{package}/{m}.py" for m in MAY_IMPORT_ANYTHING],
            "upward_exempt": exempt,
            "unlayered": unlayered,
            "rooms": rooms(edges, modules, package, packages),
        },
        "sites": {kind: {"title": SITE_PATTERNS[kind]["title"], "count": len(rows), "sites": rows}
                  for kind, rows in sites.items()},
        "bare_raises": {"count": len(raises), "sites": raises},
        "duplicates": dup,
    }
    longest = functions[0] if functions else None
    out["headline"] = {
        "files per folder": ", ".join(f"{r['folder'].partition('/')[2] or package} {r['files']}" for r in folders)
                            + f" ({out['totals']['files']} files, {out['totals']['lines']} lines)",
        "longest function": f"{longest['module']}:{longest['qualname']} {longest['lines']}" if longest else "none",
        "import loops, module-level imports": len(out["imports"]["module_level"]["loops"]),
        "import loops, all imports": len(out["imports"]["all"]["loops"]),
        "upward arrows": len(upward),
        SITE_PATTERNS["resume_identity"]["title"]: len(sites["resume_identity"]),
        SITE_PATTERNS["report"]["title"]: len(sites["report"]),
        "bare raises": len(raises),
        "duplicates pairs": dup["pairs"] if dup["pairs"] is not None else dup["line"],
    }
    return out


# -- output ----------------------------------------------------------------------------------------

def _edge(e: dict) -> str:
    return f"{e['src']} -> {e['dst']} ({e['path']}:{e['line']}{'' if e['module_level'] else ', not at module level'})"


def text_report(r: dict) -> str:
    """The readable report."""
    out = [f"house measurements of {r['folder']} (package {r['package']}"
           + (f", commit {r['commit']})" if r["commit"] else ")")]
    if r["unparsed"]:
        out.append(f"not parsed (syntax errors, left out of 2-5): {', '.join(r['unparsed'])}")

    out += ["", "1. files per folder", f"   rule: {r['rules']['files']}"]
    for row in r["folders"]:
        out.append(f"   {row['folder']:<36} {row['files']:>4} files{' +init' if row['init'] else '      '}"
                   f" {row['lines']:>7} lines")
    t = r["totals"]
    out.append(f"   {'total':<36} {t['files']:>4} files       {t['lines']:>7} lines in {t['folders']} folders")

    fn = r["functions"]
    out += ["", f"2. longest function bodies ({fn['count']} functions)", f"   rule: {r['rules']['functions']}"]
    out += [f"   {f['module']}:{f['qualname']} {f['lines']}" for f in fn["longest"]]
    out.append("   longest per group:")
    out += [f"   {g:<10} {f['module']}:{f['qualname']} {f['lines']}"
            for g, f in sorted(fn["longest_per_group"].items())]

    im = r["imports"]
    out += ["", f"3. import loops ({im['modules']} modules)", f"   rule: {r['rules']['imports']}"]
    for variant, title in (("module_level", "module-level imports"), ("all", "all imports, lazy included")):
        v = im[variant]
        out.append(f"   {title}: {v['edges']} imports, {len(v['loops'])} loop(s)")
        for loop in v["loops"]:
            out.append(f"     loop of {len(loop['members'])}: {', '.join(loop['members'])}")
            out += [f"       {e}" for e in loop["edges"]]
    out.append(f"   upward arrows: {len(im['upward'])}")
    out.append(f"   rule: {r['rules']['upward']}")
    out += [f"     {e['from']} -> {e['to']}: {_edge(e)}" for e in im["upward"]]
    out.append(f"   upward imports of the modules that may import anything (information): {len(im['upward_exempt'])}")
    out += [f"     {e['from']} -> {e['to']}: {_edge(e)}" for e in im["upward_exempt"]]
    if im["unlayered"]:
        out.append(f"   groups without a layer (not judged): {', '.join(im['unlayered'])}")
    rm = im["rooms"]
    if not rm["subfolders"]:
        out.append(f"   rooms of {rm['folder']}: no subfolders")
    else:
        out.append(f"   rooms of {rm['folder']}: {', '.join(rm['rooms'])}")
        for variant, title in (("module_level", "module-level imports"), ("all", "all imports")):
            v = rm[variant]
            out.append(f"     {title}: {len(v['loops'])} loop(s) among rooms")
            out += [f"       {edge}: {n}" for edge, n in v["edges"].items()]
            for loop in v["loops"]:
                out.append(f"       loop: {', '.join(loop['members'])}")
                out += [f"         {e}" for e in loop["edges"]]

    out += ["", "4. sites"]
    for kind, s in r["sites"].items():
        p = SITE_PATTERNS[kind]
        pattern = ", ".join([f"{n}(...)" for n in p["call_names"]] + [f"*{n}*(...)" for n in p["call_name_contains"]]
                            + [f"x.{n}(...)" for n in p["method_calls"]]
                            + [f'{{"{k}": ...}}, x["{k}"] = ...' for k in p["dict_keys"]])
        if p["call_name_excludes"]:
            pattern += "; not " + ", ".join(p["call_name_excludes"])
        if p.get("exclude_paths"):
            pattern += "; not in " + ", ".join(p["exclude_paths"])
        out.append(f"   {s['title']}: {s['count']}")
        out.append(f"   rule: {pattern}")
        out += [f"     {site}" for site in s["sites"]]

    br = r["bare_raises"]
    out += ["", f"5. bare raises: {br['count']}", f"   rule: {r['rules']['bare_raises']}"]
    out += [f"     {site}" for site in br["sites"]]

    out += ["", "6. duplicates", f"   {r['duplicates']['line']}"]
    return "\n".join(out)


def markdown_table(r: dict) -> str:
    """The headline figures as a markdown table."""
    out = [f"Measured by `python benchmarks/house.py` on `{r['package']}`"
           + (f" at `{r['commit']}`" if r["commit"] else "") + ".", "", "| figure | value |", "| --- | --- |"]
    for name, value in r["headline"].items():
        out.append(f"| {name} | {value} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Measure the package and print the report; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="blocklin",
                        help="package folder, relative to this folder or to the repository root (default blocklin)")
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print one JSON object with everything")
    fmt.add_argument("--markdown", action="store_true", help="print a markdown table of the headline figures")
    args = parser.parse_args(argv)
    folder = args.package if os.path.isdir(args.package) else os.path.join(ROOT, args.package)
    if not os.path.isdir(folder):
        parser.error(f"no package folder {args.package!r} here or in {ROOT}")
    report = measure(folder)
    if args.json:
        print(json.dumps(report, indent=1))
    elif args.markdown:
        print(markdown_table(report))
    else:
        print(text_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
