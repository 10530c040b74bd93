"""``python -m fragctl ARGS...``: the ``fragctl`` command (replay, report,
info, convert, policies; ``python -m fragctl --help``).

Runs the ``fragctl`` binary the wheel carries (``fragctl/bin/fragctl``), or,
imported from a checkout, the one in its newest ``build*/tools/``. The
exit status is the command's.
"""
import glob
import os
import sys
from typing import List, Optional


def command_path() -> Optional[str]:
    """Path of the fragctl binary this package runs, or None."""
    here = os.path.dirname(os.path.abspath(__file__))
    bundled = os.path.join(here, "bin", "fragctl")
    if os.access(bundled, os.X_OK):
        return bundled
    checkout = os.path.dirname(os.path.dirname(here))
    built = [p for p in glob.glob(os.path.join(checkout, "build*", "tools", "fragctl")) if os.access(p, os.X_OK)]
    built.sort(key=lambda p: (os.path.basename(os.path.dirname(os.path.dirname(p))) != "build",
                              -os.path.getmtime(p)))
    return built[0] if built else None


def main(argv: Optional[List[str]] = None) -> int:
    """Replaces this process with ``fragctl ARGV...`` (default: sys.argv[1:]);
    returns 1 with a message when there is no fragctl binary."""
    path = command_path()
    if path is None:
        sys.stderr.write("fragctl: no fragctl binary in this package; install it with `pip install ./python` "
                         "from a checkout, or build it (tools/build.sh)\n")
        return 1
    args = sys.argv[1:] if argv is None else argv
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, ["fragctl"] + list(args))
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
