"""tools/check_layers.py on small trees: it passes a tree that follows
layers.txt and fails each kind of include and Python import the rule
forbids (CTest `check_layers_test`; `layer_order` runs it on the real
tree)."""
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "tools" / "check_layers.py"

MANIFEST = textwrap.dedent("""\
    1 low
        src/low
        include/fragctl/low.hpp
        shared src/low/shared.hpp
    2 mid
        src/mid
        include/fragctl/mid.hpp
    2 side
        src/side
    3 top
        src/top
    4 pylow
        py/pkg/_low.py
        py/pkg/_made.py
    5 pymid
        py/pkg/__init__.py
        py/pkg/mid.py
    5 pyside
        py/pkg/side.py
    6 pytop
        py/pkg/top
    """)


class check_layers(unittest.TestCase):
    def tree(self, files: dict[str, str]) -> pathlib.Path:
        root = pathlib.Path(self.enterContext(tempfile.TemporaryDirectory()))
        base = {
            "layers.txt": MANIFEST,
            "include/fragctl/low.hpp": "#pragma once\n#include <cstddef>\n",
            "include/fragctl/mid.hpp": '#pragma once\n#include "fragctl/low.hpp"\n',
            "src/low/shared.hpp": "#pragma once\n",
            "src/low/private.hpp": "#pragma once\n",
            "src/low/low.cpp": '#include "low/private.hpp"\n#include "fragctl/low.hpp"\n',
            "src/mid/mid.cpp": '#include "fragctl/mid.hpp"\n#include "low/shared.hpp"\n#include "absl/status/status.h"\n',
            "src/side/side.cpp": '#include "fragctl/low.hpp"\n',
            "src/top/top.cpp": '#include "fragctl/mid.hpp"\n#include <fragctl/low.hpp>\n',
            # A package: a module imports its own layer and the ones below,
            # relative or absolute, at the top or inside a function.
            # _made.py: named in layers.txt, written by a build.
            "py/pkg/_low.py": "import os\nfrom . import _made\n",
            "py/pkg/__init__.py": "from ._low import helper\nfrom . import mid\n",
            "py/pkg/mid.py": "import json\nfrom pkg._low import helper\n",
            "py/pkg/side.py": "from . import _low\n",
            "py/pkg/top/__init__.py": "from .. import mid, side\nfrom .use import run\n",
            "py/pkg/top/use.py": "import pkg.side\n\n\ndef run():\n    from .. import helper\n    import torch\n",
        }
        base.update(files)
        for rel, text in base.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        return root

    def run_on(self, root: pathlib.Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)],
                              capture_output=True, text=True, check=False)

    def assert_fails(self, files: dict[str, str], message: str) -> None:
        result = self.run_on(self.tree(files))
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn(message, result.stdout)

    def test_a_tree_that_follows_the_order_passes(self):
        result = self.run_on(self.tree({}))
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("check_layers: ok", result.stdout)

    def test_an_include_pointing_up_fails(self):
        self.assert_fails({"src/low/bad.cpp": '#include "fragctl/mid.hpp"\n'},
                          "src/low/bad.cpp:1: low includes fragctl/mid.hpp: mid is above low")

    def test_a_public_header_pointing_up_fails(self):
        self.assert_fails({"include/fragctl/low.hpp": '#include "fragctl/mid.hpp"\n'}, "mid is above low")

    def test_an_include_into_a_peer_fails(self):
        self.assert_fails({"src/side/bad.cpp": '#include "fragctl/mid.hpp"\n'}, "mid is a peer of side")

    def test_another_layers_private_header_fails(self):
        self.assert_fails({"src/top/bad.cpp": '#include "low/private.hpp"\n'}, "a private header of low")

    def test_a_relative_path_into_another_layer_fails(self):
        self.assert_fails({"src/top/bad.cpp": '#include "../low/private.hpp"\n'}, "a private header of low")

    def test_a_public_header_including_a_private_one_fails(self):
        self.assert_fails({"include/fragctl/mid.hpp": '#include "low/shared.hpp"\n'},
                          "a public header includes only public headers")

    def test_a_file_no_layer_owns_fails(self):
        self.assert_fails({"src/new/thing.cpp": "int x;\n"}, "src/new/thing.cpp: no layer owns this file")

    def test_an_unknown_fragctl_header_fails(self):
        self.assert_fails({"src/top/bad.cpp": '#include "fragctl/gone.hpp"\n'}, "no such fragctl header")

    def test_a_python_import_pointing_up_fails(self):
        self.assert_fails({"py/pkg/_low.py": "from .mid import thing\n"},
                          "py/pkg/_low.py:1: pylow imports pkg.mid (from .mid import thing): pymid is above pylow")

    def test_a_lazy_python_import_pointing_up_fails(self):
        self.assert_fails({"py/pkg/mid.py": "def later():\n    import pkg.top.use\n"},
                          "py/pkg/mid.py:2: pymid imports pkg.top.use (import pkg.top.use): pytop is above pymid")

    def test_importing_a_name_of_a_package_above_fails(self):
        # `from pkg import helper` reaches pkg/__init__.py: helper is no module.
        self.assert_fails({"py/pkg/_low.py": "from pkg import helper\n"}, "pymid is above pylow")

    def test_a_python_import_of_a_peer_fails(self):
        self.assert_fails({"py/pkg/side.py": "from . import mid\n"}, "pymid is a peer of pyside")

    def test_a_python_import_cycle_fails(self):
        # Inside one layer, the second import lazy: still a cycle.
        self.assert_fails({"py/pkg/top/a.py": "from . import b\n",
                           "py/pkg/top/b.py": "def f():\n    from .a import x\n"},
                          "py/pkg/top/a.py: an import cycle: py/pkg/top/a.py:1 -> py/pkg/top/b.py:2 -> py/pkg/top/a.py")

    def test_a_module_no_layer_owns_fails(self):
        self.assert_fails({"py/pkg/new.py": "x = 1\n"}, "py/pkg/new.py: no layer owns this module")

    def test_an_import_of_a_missing_module_fails(self):
        self.assert_fails({"py/pkg/top/use.py": "from ..gone import x\n"}, "no such module in the tree")

    def test_a_bad_manifest_is_an_error(self):
        result = self.run_on(self.tree({"layers.txt": "2 b\n    src/b\n1 a\n    src/a\n"}))
        self.assertEqual(result.returncode, 2)
        self.assertIn("lowest rank first", result.stderr)


if __name__ == "__main__":
    unittest.main()
