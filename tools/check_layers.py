#!/usr/bin/env python3
"""Checks that every #include in the library respects the layer order.

    tools/check_layers.py [--root DIR]

Reads DIR/layers.txt (the layers, lowest first, and the folders and headers
each owns; its header states the rule), scans every C/C++ file under the
folders it names, and prints one line per include that points up, into a
peer, or into another layer's private header, and per file no layer owns.
Exit status 0 when the tree follows the rule, 1 when it does not, 2 when
layers.txt cannot be read. CTest runs it as `layer_order`.
"""
from __future__ import annotations

import argparse
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


def check(root: pathlib.Path) -> list[str]:
    layers = read_manifest(root / "layers.txt")
    # Generated headers (version.hpp) are named in layers.txt but not in the tree.
    known = {p for layer in layers for p in layer.paths if pathlib.PurePosixPath(p).suffix}
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
            elif theirs is mine:
                continue
            elif theirs.rank > mine.rank:
                problems.append(f"{where}: {theirs.name} is above {mine.name}")
            elif theirs.rank == mine.rank:
                problems.append(f"{where}: {theirs.name} is a peer of {mine.name}")
            elif not target.startswith(PUBLIC_ROOT) and target not in theirs.shared:
                problems.append(f"{where}: a private header of {theirs.name} "
                                f"(make it public, or mark it 'shared' in layers.txt)")
    return problems


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
        print(f"check_layers: {len(problems)} include(s) break the layer order (layers.txt)")
        return 1
    print("check_layers: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
