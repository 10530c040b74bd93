"""tools/check_entry_points.py on small trees: it passes a tree whose lists
agree with its headers and fails each disagreement of names, counts and
argument or result types (CTest
`check_entry_points_test`; `c_entry_points` runs it on the real tree)."""
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "tools" / "check_entry_points.py"

HEADER = textwrap.dedent("""\
    /* fragctl_commented(int a); is not a declaration */
    #define FRAGCTL_API __attribute__((visibility("default")))
    typedef struct fragctl_thing fragctl_thing;
    typedef int (*fragctl_callback)(void* context);
    typedef struct fragctl_table {
      int (*fragctl_member)(void* a, void* b);
    } fragctl_table;
    FRAGCTL_API const char* fragctl_name(void);
    FRAGCTL_API int fragctl_make(const char* a, int b,
                                 fragctl_thing** out);
    FRAGCTL_API int fragctl_visit(fragctl_thing* t, void (*visit)(const void* item, void* context), void* context);
    """)

# A service header without FRAGCTL_API (as zero3.h was written).
SERVICE = "size_t fragctl_service_query(void* s, char* buffer, size_t capacity);\n"

CAPI = textwrap.dedent("""\
    import ctypes


    def _declare(lib):
        c = ctypes
        p = c.c_void_p
        signatures = {
            "fragctl_name": (c.c_char_p, []),
            "fragctl_make": (c.c_int, [c.c_char_p, c.c_int, c.POINTER(p)]),
            "fragctl_visit": (c.c_int, [p, p, p]),
            "fragctl_service_query": (c.c_size_t, [p, c.c_char_p, c.c_size_t]),
        }
        for name, (restype, argtypes) in signatures.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
    """)

NATIVE = textwrap.dedent("""\
    #define FRAGCTL_TORCH_C_API(X) \\
      X(fragctl_make)              \\
      X(fragctl_visit)
    """)


class check_entry_points(unittest.TestCase):
    def run_on(self, **changes):
        files = {"include/fragctl/fragctl.h": HEADER, "include/fragctl/zero3/zero3.h": SERVICE,
                 "python/fragctl/_capi.py": CAPI, "python/fragctl/_native/c_api.hpp": NATIVE}
        for key, (old, new) in changes.items():
            path = {"header": "include/fragctl/fragctl.h", "capi": "python/fragctl/_capi.py",
                    "native": "python/fragctl/_native/c_api.hpp"}[key]
            self.assertIn(old, files[path])
            files[path] = files[path].replace(old, new)
        root = pathlib.Path(self.enterContext(tempfile.TemporaryDirectory()))
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True)

    def test_agreeing_lists_pass(self):
        done = self.run_on()
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("ok (4 entry points; 4 in _capi, 2 in the native module)", done.stdout)

    def test_an_argument_count_that_differs_fails(self):
        done = self.run_on(capi=('[c.c_char_p, c.c_int, c.POINTER(p)]', '[c.c_char_p, c.POINTER(p)]'))
        self.assertEqual(done.returncode, 1)
        self.assertIn("fragctl_make has 2 argtypes; include/fragctl/fragctl.h declares 3 parameters", done.stdout)

    def test_a_header_change_is_seen(self):
        done = self.run_on(header=("int b,\n", ""))
        self.assertEqual(done.returncode, 1)
        self.assertIn("fragctl_make has 3 argtypes; include/fragctl/fragctl.h declares 2 parameters", done.stdout)

    def test_a_name_no_header_declares_fails_in_either_list(self):
        done = self.run_on(capi=('"fragctl_name"', '"fragctl_nmae"'),
                           native=("X(fragctl_visit)", "X(fragctl_vist)"))
        self.assertEqual(done.returncode, 1)
        self.assertIn("_declare declares fragctl_nmae, which no header declares", done.stdout)
        self.assertIn("FRAGCTL_TORCH_C_API lists fragctl_vist, which no header declares", done.stdout)

    def assert_fails(self, message, **changes):
        done = self.run_on(**changes)
        self.assertEqual(done.returncode, 1, done.stdout)
        self.assertIn(message, done.stdout)

    def test_an_argument_of_another_width_fails(self):
        self.assert_fails("fragctl_service_query argument 3 is c_int, a 32-bit integer; include/fragctl/zero3/zero3.h "
                          "has size_t capacity, a 64-bit integer (another width)",
                          capi=("[p, c.c_char_p, c.c_size_t]", "[p, c.c_char_p, c.c_int]"))

    def test_a_return_type_of_another_width_fails(self):
        self.assert_fails("fragctl_service_query returns c_int, a 32-bit integer; include/fragctl/zero3/zero3.h "
                          "returns a 64-bit integer",
                          capi=('"fragctl_service_query": (c.c_size_t,', '"fragctl_service_query": (c.c_int,'))

    def test_an_integer_for_a_pointer_fails(self):
        self.assert_fails("fragctl_make argument 3 is c_ulong, a 64-bit integer; include/fragctl/fragctl.h has "
                          "fragctl_thing** out, a pointer to a pointer to fragctl_thing (not a pointer)",
                          capi=("[c.c_char_p, c.c_int, c.POINTER(p)]", "[c.c_char_p, c.c_int, c.c_size_t]"))

    def test_a_pointer_to_another_width_fails(self):
        header = ("fragctl_thing** out", "size_t* out")
        done = self.run_on(header=header, capi=("c.POINTER(p)]", "c.POINTER(c.c_size_t)]"))
        self.assertEqual(done.returncode, 0, done.stdout)  # the control: size_t* as POINTER(c_size_t)
        self.assert_fails("fragctl_make argument 3 is LP_c_int, a pointer to a 32-bit integer; "
                          "include/fragctl/fragctl.h has size_t* out, a pointer to a 64-bit integer "
                          "(points to another width or kind)",
                          header=header, capi=("c.POINTER(p)]", "c.POINTER(c.c_int)]"))

    def test_a_callback_of_another_signature_fails(self):
        done = self.run_on(capi=("[p, p, p]", "[p, c.CFUNCTYPE(None, c.c_void_p, p), p]"))
        self.assertEqual(done.returncode, 0, done.stdout)  # the control: the header's own signature
        header = ("include/fragctl/fragctl.h has void (*visit)(const void* item, void* context), a function "
                  "pointer of 2 parameters")
        self.assert_fails("fragctl_visit argument 2 is CFunctionType, a function pointer of 1 parameters; " + header +
                          " (1 parameters where the header's have 2)",
                          capi=("[p, p, p]", "[p, c.CFUNCTYPE(None, c.c_void_p), p]"))
        self.assert_fails("fragctl_visit argument 2 is CFunctionType, a function pointer of 2 parameters; " + header +
                          " (its parameter 1: not a pointer)",
                          capi=("[p, p, p]", "[p, c.CFUNCTYPE(None, c.c_int64, p), p]"))

    def test_comments_typedefs_and_members_are_not_entry_points(self):
        done = self.run_on(capi=('"fragctl_name": (c.c_char_p, []),',
                                 '"fragctl_name": (c.c_char_p, []), "fragctl_member": (c.c_int, [p, p]),'))
        self.assertEqual(done.returncode, 1)
        self.assertIn("fragctl_member, which no header declares", done.stdout)


if __name__ == "__main__":
    unittest.main()
