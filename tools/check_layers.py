#!/usr/bin/env python3
"""Checks that every #include and Python import in the library respects the
layer order.

    tools/check_layers.py [--root DIR]

Reads DIR/layers.txt (the layers, lowest first, and the folders, headers and
Python modules each owns; its header states the rule), scans every C/C++
file under the folders it names and every module of the Python packages they
reach, and prints one line per include or import that points up, into a
peer, or into another layer's private header, per import cycle among the
Python modules, and per file no layer owns. Exit status 0 when the tree
follows the rule, 1 when it does not, 2 when layers.txt cannot be read.
CTest runs it as `layer_order`.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import pathlib
import posixpath
import re
import sys

SOURCE_SUFFIXES = {".c", ".cc", ".cpp", ".h", ".hpp"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
# Search roots for an include, in the order the build's include paths give.
INCLUDE_ROOTS = ("include", "src", ".")
PUBLIC_ROOT = "include/"
PYTHON_SUFFIX = ".py"


@dataclasses.dataclass
class Layer:
    rank: int
    name: str
    paths: list[str] = dataclasses.field(default_factory=list)
    shared: set[str] = dataclasses.field(default_factory=set)


class ManifestError(Exception):
    pass


def read_manifest(path: pathlib.Path) -> list[Layer]:
    layers: list[Layer] = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not line:
            continue
        words = line.split()
        if not raw[0].isspace():
            if len(words) != 2 or not words[0].isdigit():
                raise ManifestError(f"{path}:{number}: expected 'RANK NAME', got {line.strip()!r}")
            layers.append(Layer(int(words[0]), words[1]))
            continue
        if not layers:
            raise ManifestError(f"{path}:{number}: a path before the first layer")
        if words[0] == "shared" and len(words) == 2:
            layers[-1].paths.append(words[1])
            layers[-1].shared.add(words[1])
        elif len(words) == 1:
            layers[-1].paths.append(words[0])
        else:
            raise ManifestError(f"{path}:{number}: expected 'PATH' or 'shared PATH', got {line.strip()!r}")
    ranks = [layer.rank for layer in layers]
    if ranks != sorted(ranks):
        raise ManifestError(f"{path}: layers must be listed lowest rank first")
    return layers


def owner(layers: list[Layer], rel: str) -> Layer | None:
    """The layer owning `rel` (a path relative to the root): the longest path
    naming the file itself or a folder above it."""
    best, best_len = None, -1
    for layer in layers:
        for p in layer.paths:
            if (rel == p or rel.startswith(p.rstrip("/") + "/")) and len(p) > best_len:
                best, best_len = layer, len(p)
    return best


def resolve(root: pathlib.Path, includer: str, name: str, known: set[str]) -> str | None:
    """The root-relative path `#include name` in `includer` reaches, or None
    for a header from outside the tree (the standard library, Abseil...)."""
    candidates = [str(pathlib.PurePosixPath(includer).parent / name)]
    candidates += [str(pathlib.PurePosixPath(r) / name) for r in INCLUDE_ROOTS]
    for c in candidates:
        c = posixpath.normpath(c)
        if c in known or (root / c).is_file():
            return c
    return None


def source_files(root: pathlib.Path, layers: list[Layer]) -> list[str]:
    files: set[str] = set()
    for layer in layers:
        for p in layer.paths:
            full = root / p
            if full.is_file():
                files.add(p)
            elif full.is_dir():
                files.update(str(f.relative_to(root)) for f in full.rglob("*")
                             if f.suffix in SOURCE_SUFFIXES and f.is_file())
    # Files under a scanned top folder that no layer names are errors too.
    for top in {p.split("/", 1)[0] for layer in layers for p in layer.paths}:
        if (root / top).is_dir():
            files.update(str(f.relative_to(root)) for f in (root / top).rglob("*")
                         if f.suffix in SOURCE_SUFFIXES and f.is_file())
    return sorted(files)


def check_includes(root: pathlib.Path, layers: list[Layer], known: set[str]) -> list[str]:
    problems: list[str] = []
    for rel in source_files(root, layers):
        mine = owner(layers, rel)
        if mine is None:
            problems.append(f"{rel}: no layer owns this file; add its folder to layers.txt")
            continue
        text = (root / rel).read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            name = m.group(2)
            target = resolve(root, rel, name, known)
            where = f"{rel}:{number}: {mine.name} includes {name}"
            if target is None:
                if name.startswith("fragctl/"):
                    problems.append(f"{where}: no such fragctl header")
                continue
            theirs = owner(layers, target)
            if theirs is None:
                problems.append(f"{where}: {target} belongs to no layer (tests and tools are not includable)")
                continue
            if rel.startswith(PUBLIC_ROOT) and not target.startswith(PUBLIC_ROOT):
                problems.append(f"{where}: a public header includes only public headers")
                continue
            problem = crossing(mine, theirs)
            if problem:
                problems.append(f"{where}: {problem}")
            elif theirs is not mine and not target.startswith(PUBLIC_ROOT) and target not in theirs.shared:
                problems.append(f"{where}: a private header of {theirs.name} "
                                f"(make it public, or mark it 'shared' in layers.txt)")
    return problems


def crossing(mine: Layer, theirs: Layer) -> str | None:
    """What is wrong with a file of `mine` reaching one of `theirs`, or None."""
    if theirs is mine or theirs.rank < mine.rank:
        return None
    if theirs.rank > mine.rank:
        return f"{theirs.name} is above {mine.name}"
    return f"{theirs.name} is a peer of {mine.name}"


# The Python wing. A module's layer is found as a file's is (layers.txt
# names the module's file or a folder above it); its imports are read with
# `ast`, wherever they stand (inside a function too), and each names the
# module it reaches: `from P import N` reaches the submodule P.N where there
# is one, else P itself (N is a name P defines). The parent packages Python
# runs first are not counted. Imports of modules outside the tree (the
# standard library, torch) are not checked.


@dataclasses.dataclass
class Import:
    line: int
    text: str  # the statement, as written ("from . import _capi")
    module: str  # the module it reaches ("fragctl._capi")
    target: str | None  # that module's file, None when there is no such module


def package_roots(root: pathlib.Path, layers: list[Layer], known: set[str]) -> dict[str, str]:
    """The top packages the layers reach: their name -> their folder. A
    folder is a package when it holds an __init__.py; the top one is the
    highest such folder above a path a layer names."""
    def is_package(folder: pathlib.PurePosixPath) -> bool:
        init = str(folder / "__init__.py")
        return init in known or (root / init).is_file()

    tops: dict[str, str] = {}
    for layer in layers:
        for p in layer.paths:
            path = pathlib.PurePosixPath(p)
            folder = path.parent if path.suffix == PYTHON_SUFFIX else path
            top = None
            while str(folder) not in ("", ".") and is_package(folder):
                top, folder = folder, folder.parent
            if top is not None:
                tops[top.name] = str(top)
    return tops


def python_files(root: pathlib.Path, tops: dict[str, str]) -> list[str]:
    return sorted(str(f.relative_to(root)) for top in tops.values() for f in (root / top).rglob("*" + PYTHON_SUFFIX)
                  if f.is_file())


def module_name(rel: str, tops: dict[str, str]) -> tuple[str, bool]:
    """(the dotted name of the module in file `rel`, whether it is a package)."""
    for name, folder in tops.items():
        if rel.startswith(folder + "/"):
            parts = [name] + rel[len(folder) + 1:-len(PYTHON_SUFFIX)].split("/")
            if parts[-1] == "__init__":
                return ".".join(parts[:-1]), True
            return ".".join(parts), False
    raise ValueError(rel)


def module_file(root: pathlib.Path, module: str, tops: dict[str, str], known: set[str]) -> str | None:
    """The file of `module` (a dotted name under a top package), or None."""
    parts = module.split(".")
    base = tops[parts[0]] + "".join("/" + part for part in parts[1:])
    for candidate in (base + PYTHON_SUFFIX, base + "/__init__.py"):
        if candidate in known or (root / candidate).is_file():
            return candidate
    return None


def imports(root: pathlib.Path, rel: str, tops: dict[str, str], known: set[str]) -> list[Import]:
    """The imports of the module in `rel` that reach the tree's packages."""
    tree = ast.parse((root / rel).read_text(errors="replace"), filename=rel)
    name, is_package = module_name(rel, tops)
    package = name if is_package else name.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in tops:
                    found.append(Import(node.lineno, "import " + alias.name, alias.name,
                                        module_file(root, alias.name, tops, known)))
        elif isinstance(node, ast.ImportFrom):
            text = "from " + "." * node.level + (node.module or "") + " import " + \
                ", ".join(alias.name for alias in node.names)
            if node.level:
                base = package.split(".")
                if node.level - 1 >= len(base):
                    found.append(Import(node.lineno, text, text, None))
                    continue
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] in tops:
                module = node.module
            else:
                continue
            for alias in node.names:
                sub = module + "." + alias.name
                sub_file = module_file(root, sub, tops, known) if alias.name != "*" else None
                if sub_file is not None:
                    found.append(Import(node.lineno, text, sub, sub_file))
                else:
                    found.append(Import(node.lineno, text, module, module_file(root, module, tops, known)))
    unique = {(i.line, i.module): i for i in found}  # `from . import a, b` may reach one module twice
    return [unique[key] for key in sorted(unique)]


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a list of files, the first repeated at the end) in each
    strongly connected part of the import graph that has more than one file
    (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    parts: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, {})):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                parts.append(sorted(part))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    found = []
    for part in sorted(parts):
        members, start = set(part), part[0]
        # The shortest way from `start` back to itself inside the part.
        paths, seen = [[start]], {start}
        while paths:
            path = paths.pop(0)
            nxt_found = None
            for nxt in sorted(edges[path[-1]]):
                if nxt == start:
                    nxt_found = path + [start]
                    break
                if nxt in members and nxt not in seen:
                    seen.add(nxt)
                    paths.append(path + [nxt])
            if nxt_found:
                found.append(nxt_found)
                break
    return found


def check_imports(root: pathlib.Path, layers: list[Layer], known: set[str]) -> list[str]:
    tops = package_roots(root, layers, known)
    problems: list[str] = []
    edges: dict[str, dict[str, int]] = {}
    for rel in python_files(root, tops):
        mine = owner(layers, rel)
        if mine is None:
            problems.append(f"{rel}: no layer owns this module; add it or its folder to layers.txt")
            continue
        try:
            found = imports(root, rel, tops, known)
        except SyntaxError as e:
            problems.append(f"{rel}:{e.lineno}: cannot be read: {e.msg}")
            continue
        edges.setdefault(rel, {})
        for imp in found:
            where = f"{rel}:{imp.line}: {mine.name} imports {imp.module} ({imp.text})"
            if imp.target is None:
                problems.append(f"{where}: no such module in the tree")
                continue
            if imp.target != rel:
                edges[rel].setdefault(imp.target, imp.line)
            theirs = owner(layers, imp.target)
            if theirs is None:
                problems.append(f"{where}: {imp.target} belongs to no layer")
                continue
            problem = crossing(mine, theirs)
            if problem:
                problems.append(f"{where}: {problem}")
    for cycle in cycles(edges):
        hops = " -> ".join(f"{a}:{edges[a][b]}" for a, b in zip(cycle, cycle[1:]))
        problems.append(f"{cycle[0]}: an import cycle: {hops} -> {cycle[0]} "
                        f"(each file:line imports the next; break it by moving what both need into a lower module)")
    return problems


def check(root: pathlib.Path) -> list[str]:
    layers = read_manifest(root / "layers.txt")
    # Generated files (version.hpp, _version.py) are named in layers.txt but not in the tree.
    known = {p for layer in layers for p in layer.paths if pathlib.PurePosixPath(p).suffix}
    return check_includes(root, layers, known) + check_imports(root, layers, known)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent.parent,
                        help="the source tree (default: this script's checkout)")
    args = parser.parse_args()
    try:
        problems = check(args.root)
    except (ManifestError, OSError) as e:
        print(f"check_layers: {e}", file=sys.stderr)
        return 2
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) or import(s) break the layer order (layers.txt)")
        return 1
    print("check_layers: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
