#!/usr/bin/env python3
"""The C entry points, written once: the headers declare them, every other
list of them is checked against the headers (CTest `c_entry_points`).

Reads the function declarations of fragctl's C headers
(include/fragctl/*.h, include/fragctl/checkpoint/checkpoint.h,
include/fragctl/zero3/zero3.h): name, return type and parameter types. Then
checks the two lists written elsewhere:

* ``python/fragctl/_capi.py``, ``_declare``: every name it declares is in a
  header, with as many argtypes as the header has parameters, and each
  argtype, and the restype, of the header's class (the dict is read by
  calling ``_declare`` on a stand-in library, so it is read as Python reads
  it). The classes are what the ABI passes (LP64 Linux): an integer of a
  width (signedness aside: int and unsigned are both 32 bits), a float of a
  width, a pointer, void. A pointer argument may be ``c_void_p`` whatever it
  points to; ``c_char_p`` only for char or void pointers; ``POINTER(t)``
  must point to the header's class where that is a scalar or a pointer;
  ``CFUNCTYPE(...)`` must have the function pointer's own signature. Structs
  and types the headers do not define are not compared beyond that.
* ``python/fragctl/_native/c_api.hpp``, ``FRAGCTL_TORCH_C_API``: every name
  the native PyTorch module resolves is in a header (its types are the
  header's: ``decltype(&::name)``, so only the names can differ).

Prints ``check_entry_points: ok (N entry points; M in _capi, K in the native
module)`` or one line per disagreement, and exits 1.

    python3 tools/check_entry_points.py [--root DIR]
"""
import argparse
import ctypes
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


def parameters(params):
    """The top-level comma-separated parameters; "void" or nothing is none."""
    params = params.strip()
    if params in ("", "void"):
        return []
    depth, out, start = 0, [], 0
    for i, c in enumerate(params):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(params[start:i].strip())
            start = i + 1
    out.append(params[start:].strip())
    return out


# The C types by what the ABI passes (LP64 Linux): ("int", bits),
# ("float", bits), ("char",) (an 8-bit integer, told apart for char
# pointers), ("void",); and, built from them, ("ptr", pointee),
# ("fn", result, [parameters]) (a function pointer), ("struct", name),
# ("unknown", name).
SCALARS = {"void": ("void",), "char": ("char",), "signed char": ("char",), "unsigned char": ("char",),
           "_Bool": ("int", 8), "bool": ("int", 8), "int8_t": ("int", 8), "uint8_t": ("int", 8),
           "short": ("int", 16), "unsigned short": ("int", 16), "int16_t": ("int", 16), "uint16_t": ("int", 16),
           "int": ("int", 32), "unsigned": ("int", 32), "unsigned int": ("int", 32), "signed": ("int", 32),
           "int32_t": ("int", 32), "uint32_t": ("int", 32),
           "long": ("int", 64), "unsigned long": ("int", 64), "long long": ("int", 64),
           "unsigned long long": ("int", 64), "int64_t": ("int", 64), "uint64_t": ("int", 64),
           "size_t": ("int", 64), "ssize_t": ("int", 64), "ptrdiff_t": ("int", 64), "intptr_t": ("int", 64),
           "uintptr_t": ("int", 64), "float": ("float", 32), "double": ("float", 64)}
TYPE_WORDS = {"void", "char", "short", "int", "long", "signed", "unsigned", "float", "double", "_Bool", "bool"}
QUALIFIERS = {"const", "volatile", "restrict", "struct", "enum", "union", "extern", "FRAGCTL_API"}


def c_type(text, types):
    """The class of a C type or parameter ("size_t* bytes", "const char*",
    "void (*visit)(uint64_t a, void* c)"); `types` is typedefs()'s table."""
    text = " ".join(text.split())
    fn = re.match(r"^(.*?)\(\s*\*\s*\w*\s*\)\s*\((.*)\)$", text)
    if fn:
        return ("fn", c_type(fn.group(1), types), [c_type(p, types) for p in parameters(fn.group(2))])
    tokens = [t for t in re.findall(r"\w+|\*|\[", text) if t not in QUALIFIERS]
    stars = sum(1 for t in tokens if t in ("*", "["))
    words = [t for t in tokens if t not in ("*", "[")]
    if len(words) > 1 and words[-1] not in TYPE_WORDS:
        words = words[:-1]  # the parameter's name
    base = " ".join(words)
    out = SCALARS.get(base) or types.get(base) or ("unknown", base)
    for _ in range(stars):
        out = ("ptr", out)
    return out


def typedefs(text):
    """{name: class} of the typedefs of a C header (comments stripped):
    enums are ints, structs structs, function pointer types fn."""
    out = {}
    for m in re.finditer(r"\btypedef\s+enum\b[^;{}]*\{[^{}]*\}\s*\b(\w+)\s*;", text):
        out[m.group(1)] = ("int", 32)
    for m in re.finditer(r"\btypedef\s+(?:struct|union)\b[^;{}]*?(?:\{[^{}]*\})?\s*\b(\w+)\s*;", text):
        out[m.group(1)] = ("struct", m.group(1))
    for m in re.finditer(r"\btypedef\s+([^;(){}]*?)\(\s*\*\s*(\w+)\s*\)\s*\(([^;]*)\)\s*;", text):
        out[m.group(2)] = ("fn", m.group(1), m.group(3))  # resolved once every typedef is known
    for m in re.finditer(r"\btypedef\s+((?:\w+\s+)*\w+\s*\**)\s*\b(\w+)\s*;", text):
        if not re.match(r"(?:struct|union|enum)\b", m.group(1)):
            out.setdefault(m.group(2), ("alias", m.group(1)))
    return out


def resolve_typedefs(raw):
    """typedefs()'s table with aliases and function pointer types resolved."""
    types = {name: t for name, t in raw.items() if t[0] in ("int", "struct")}
    for name, t in raw.items():
        if t[0] == "alias":
            types[name] = c_type(t[1], types)
    for name, t in raw.items():
        if t[0] == "fn":
            types[name] = ("fn", c_type(t[1], types), [c_type(p, types) for p in parameters(t[2])])
    return types


def declarations(text):
    """{name: (return type, [parameter texts])} of the fragctl_* functions a
    C header declares."""
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
        found[m.group(1)] = (statement.strip(), parameters(text[open_at + 1:close_at]))
    return found


def header_entry_points(root):
    """{name: (return class, [(parameter text, class)], header path)}."""
    texts = {}
    for pattern in HEADERS:
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            with open(path, encoding="utf-8") as f:
                texts[os.path.relpath(path, root)] = strip_c(f.read())
    raw = {}
    for text in texts.values():  # a header may use another's types
        raw.update(typedefs(text))
    types = resolve_typedefs(raw)
    out = {}
    for path, text in texts.items():
        for name, (result, params) in declarations(text).items():
            out[name] = (c_type(result, types), [(p, c_type(p, types)) for p in params], path)
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
    """{name: (restype, argtypes)} of _capi._declare, read by running it (a
    restype never set is ctypes's default, c_int)."""
    spec = importlib.util.spec_from_file_location("fragctl_capi_under_check", os.path.join(root, CAPI))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lib = _StandIn()
    module._declare(lib)
    return {name: (getattr(fn, "restype", ctypes.c_int), list(fn.argtypes)) for name, fn in lib.functions.items()}


def ctypes_type(t):
    """The class (as c_type's) of a ctypes type, None being void."""
    if t is None:
        return ("void",)
    if isinstance(t, type):
        if issubclass(t, ctypes._Pointer):
            return ("ptr", ctypes_type(t._type_))
        if issubclass(t, ctypes._CFuncPtr):
            return ("fn", ctypes_type(t._restype_), [ctypes_type(a) for a in t._argtypes_])
        if issubclass(t, (ctypes.Structure, ctypes.Union)):
            return ("struct", t.__name__)
        if issubclass(t, ctypes._SimpleCData):
            code = t._type_
            if code == "P":
                return ("ptr", ("void",))  # c_void_p
            if code in "zZ":
                return ("ptr", ("char",))  # c_char_p, c_wchar_p
            if code == "c":
                return ("char",)
            if code in "fdg":
                return ("float", 8 * ctypes.sizeof(t))
            return ("int", 8 * ctypes.sizeof(t))
    return ("unknown", repr(t))


def describe(t):
    """A class in words: "a 64-bit integer", "a pointer to a 32-bit integer"."""
    kind = t[0]
    if kind == "int":
        return "a %d-bit integer" % t[1]
    if kind == "float":
        return "a %d-bit float" % t[1]
    if kind == "char":
        return "a char"
    if kind == "void":
        return "void"
    if kind == "ptr":
        return "a pointer to " + ("void" if t[1] == ("void",) else describe(t[1]))
    if kind == "fn":
        return "a function pointer of %d parameters" % len(t[2])
    return t[1]


def scalar(t):
    """An 8-bit char is an 8-bit integer when passed by value."""
    return ("int", 8) if t == ("char",) else t


def disagreement(header, declared):
    """Why the ctypes class `declared` cannot stand for the header's class, or None."""
    if header[0] in ("unknown", "struct") or declared[0] == "unknown":
        return None if header[0] != "struct" or declared[0] == "struct" else "not a struct"
    if header[0] == "fn":
        if declared == ("ptr", ("void",)):
            return None
        if declared[0] != "fn":
            return "not a function pointer"
        if len(header[2]) != len(declared[2]):
            return "%d parameters where the header's have %d" % (len(declared[2]), len(header[2]))
        why = disagreement(header[1], declared[1])
        if why:
            return "its result: " + why
        for i, (h, d) in enumerate(zip(header[2], declared[2]), 1):
            why = disagreement(h, d)
            if why:
                return "its parameter %d: %s" % (i, why)
        return None
    if header[0] == "ptr":
        if declared[0] == "fn":
            return None if header[1] == ("void",) else "a function pointer"
        if declared[0] != "ptr":
            return "not a pointer"
        if declared[1] == ("void",) or header[1][0] in ("void", "unknown", "struct"):
            return None  # c_void_p, or a pointer to what is not compared
        if declared[1] == ("char",) and header[1] != ("char",) and header[1] != ("int", 8):
            return "c_char_p where the header's points to something else"
        pointee, ours = header[1], declared[1]
        if pointee[0] in ("ptr", "fn"):
            return None if ours[0] in ("ptr", "fn", "unknown") else "a pointer to something other than a pointer"
        if scalar(pointee) == scalar(ours) or ours[0] in ("unknown", "struct"):
            return None
        return "points to another width or kind"
    if scalar(header) == scalar(declared):
        return None
    if declared[0] in ("ptr", "fn"):
        return "a pointer where the header has a value"
    return "another width" if declared[0] == header[0] else "another kind"


def type_name(t):
    return "None" if t is None else getattr(t, "__name__", repr(t))


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
    for name, (restype, argtypes) in sorted(capi.items()):
        if name not in headers:
            problems.append("%s: _declare declares %s, which no header declares" % (CAPI, name))
            continue
        result, params, path = headers[name]
        if len(params) != len(argtypes):
            problems.append("%s: %s has %d argtypes; %s declares %d parameters"
                            % (CAPI, name, len(argtypes), path, len(params)))
            continue
        ours = ctypes_type(restype)
        why = disagreement(result, ours)
        if why:
            problems.append("%s: %s returns %s, %s; %s returns %s (%s)"
                            % (CAPI, name, type_name(restype), describe(ours), path, describe(result), why))
        for i, ((text, header), argtype) in enumerate(zip(params, argtypes), 1):
            ours = ctypes_type(argtype)
            why = disagreement(header, ours)
            if why:
                problems.append("%s: %s argument %d is %s, %s; %s has %s, %s (%s)"
                                % (CAPI, name, i, type_name(argtype), describe(ours), path,
                                   " ".join(text.split()), describe(header), why))
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
