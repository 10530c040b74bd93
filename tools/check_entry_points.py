#!/usr/bin/env python3
"""The C entry points, written once: the headers declare them, every other
list of them is checked against the headers (CTest `c_entry_points`).

Reads the function declarations of fragctl's C headers
(include/fragctl/*.h, include/fragctl/checkpoint/checkpoint.h,
include/fragctl/zero3/zero3.h): name and number of parameters. Then checks
the two lists written elsewhere:

* ``python/fragctl/_capi.py``, ``_declare``: every name it declares is in a
  header, with as many argtypes as the header has parameters (the dict is
  read by calling ``_declare`` on a stand-in library, so it is read as
  Python reads it);
* ``python/fragctl/_native/c_api.hpp``, ``FRAGCTL_TORCH_C_API``: every name
  the native PyTorch module resolves is in a header (its types are the
  header's: ``decltype(&::name)``).

Prints ``check_entry_points: ok (N entry points; M in _capi, K in the native
module)`` or one line per disagreement, and exits 1.

    python3 tools/check_entry_points.py [--root DIR]
"""
import argparse
import glob
import importlib.util
import os
import re
import sys

HEADERS = ["include/fragctl/*.h", "include/fragctl/checkpoint/checkpoint.h", "include/fragctl/zero3/zero3.h"]
CAPI = "python/fragctl/_capi.py"
NATIVE = "python/fragctl/_native/c_api.hpp"


def strip_c(text):
    """The text without comments and preprocessor lines (continued lines too)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", " ", text, flags=re.M)


def closing_paren(text, start):
    """Index of the ')' matching the '(' at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced parentheses")


def parameter_count(params):
    """Top-level comma-separated parameters; "void" or nothing is 0."""
    params = params.strip()
    if params in ("", "void"):
        return 0
    depth, count = 0, 1
    for c in params:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            count += 1
    return count


def declarations(text):
    """{name: parameter count} of the fragctl_* functions a C header declares."""
    text = strip_c(text)
    found = {}
    for m in re.finditer(r"\b(fragctl_\w+)\s*\(", text):
        before = text[:m.start()].rstrip()
        # A function's name follows its return type (a word or '*'); a function
        # pointer's name follows "(*", a call's or macro's other characters.
        if not before or not re.search(r"[\w*]$", before):
            continue
        statement = re.split(r"[;{}]", before)[-1]
        if re.match(r"\s*typedef\b", statement):
            continue
        open_at = m.end() - 1
        close_at = closing_paren(text, open_at)
        if not text[close_at + 1:].lstrip().startswith(";"):
            continue  # a definition or something else
        found[m.group(1)] = parameter_count(text[open_at + 1:close_at])
    return found


def header_entry_points(root):
    out = {}
    for pattern in HEADERS:
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            with open(path, encoding="utf-8") as f:
                for name, count in declarations(f.read()).items():
                    out[name] = (count, os.path.relpath(path, root))
    return out


class _StandIn:
    """What _declare is given instead of a ctypes library: records argtypes."""

    def __init__(self):
        self.functions = {}

    def __getattr__(self, name):
        fn = type("fn", (), {})()
        self.functions[name] = fn
        return fn


def capi_entry_points(root):
    """{name: argtypes count} of _capi._declare, read by running it."""
    spec = importlib.util.spec_from_file_location("fragctl_capi_under_check", os.path.join(root, CAPI))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lib = _StandIn()
    module._declare(lib)
    return {name: len(fn.argtypes) for name, fn in lib.functions.items()}


def native_entry_points(root):
    """Names in the native module's FRAGCTL_TORCH_C_API list."""
    with open(os.path.join(root, NATIVE), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"#define\s+FRAGCTL_TORCH_C_API\(X\)((?:[^\n]*\\\n)*[^\n]*)", text)
    if m is None:
        raise SystemExit("check_entry_points: %s has no FRAGCTL_TORCH_C_API(X) list" % NATIVE)
    return re.findall(r"X\((fragctl_\w+)\)", m.group(1))


def check(root):
    headers = header_entry_points(root)
    problems = []
    capi = capi_entry_points(root)
    for name, count in sorted(capi.items()):
        if name not in headers:
            problems.append("%s: _declare declares %s, which no header declares" % (CAPI, name))
        elif headers[name][0] != count:
            problems.append("%s: %s has %d argtypes; %s declares %d parameters"
                            % (CAPI, name, count, headers[name][1], headers[name][0]))
    native = native_entry_points(root)
    for name in native:
        if name not in headers:
            problems.append("%s: FRAGCTL_TORCH_C_API lists %s, which no header declares" % (NATIVE, name))
    if not headers:
        problems.append("no entry points found under %s" % root)
    return problems, len(headers), len(capi), len(native)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args()
    problems, headers, capi, native = check(args.root)
    for p in problems:
        print("check_entry_points: " + p)
    if problems:
        return 1
    print("check_entry_points: ok (%d entry points; %d in _capi, %d in the native module)" % (headers, capi, native))
    return 0


if __name__ == "__main__":
    sys.exit(main())
