"""The PEP 517 build backend of the fragctl package, driving fragctl's CMake build.

``pip install ./python`` (pip builds a local directory in place) calls
``build_wheel``, which

1. configures fragctl with CMake into a build directory (once: Release, no
   tests, no benchmarks) and builds the targets ``fragctl`` (libfragctl.so)
   and ``fragctl_cli`` (the ``fragctl`` command);
2. writes a wheel with the Python package, ``fragctl/lib/libfragctl.so``
   (found by ``fragctl._capi`` without ``FRAGCTL_LIBRARY``),
   ``fragctl/bin/fragctl`` (run by ``python -m fragctl``),
   ``fragctl/_version.py`` (the version of CMakeLists.txt's ``project()``,
   the one version number) and the LICENSE.

Nothing in the wheel names the checkout, so it can be copied and installed
elsewhere (a machine with the same Debian libraries: the bundled binaries
link Abseil, spdlog, fmt and jemalloc from the system). It needs no
setuptools and no network.

Where it builds: the config setting ``build-dir`` (``pip install
-C build-dir=PATH ./python``), else ``FRAGCTL_WHEEL_BUILD_DIR``, else
``build-python/`` in the checkout. A build directory that is already
configured (an existing fragctl build, e.g. ``build/``) is built as it is
configured, never reconfigured with other options.
"""
import base64
import hashlib
import io
import os
import re
import shutil
import stat
import subprocess
import sysconfig
import tarfile
import zipfile

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
_ROOT = os.path.dirname(_HERE)  # the checkout: CMakeLists.txt
_PACKAGE = "fragctl"
# Files the CMake build produces, and where the wheel puts them.
_BUILT = [("libfragctl.so", _PACKAGE + "/lib/libfragctl.so"),
          ("tools/fragctl", _PACKAGE + "/bin/fragctl")]


def _cmake_version():
    """The version in CMakeLists.txt's project() call: fragctl's one version number."""
    with open(os.path.join(_ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        match = re.search(r"project\(\s*fragctl\s+VERSION\s+([0-9][0-9.]*)", f.read())
    if not match:
        raise RuntimeError("fragctl_build: no project(fragctl VERSION ...) in %s/CMakeLists.txt" % _ROOT)
    return match.group(1)


def _project():
    with open(os.path.join(_HERE, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    project = text.split("[project]", 1)[1]
    fields = {}
    for key in ("name", "description", "requires-python"):
        match = re.search(r'^%s\s*=\s*"([^"]*)"' % re.escape(key), project, re.M)
        fields[key] = match.group(1) if match else ""
    match = re.search(r'^license\s*=\s*\{\s*text\s*=\s*"([^"]*)"', project, re.M)
    fields["license"] = match.group(1) if match else ""
    fields["version"] = _cmake_version()
    scripts = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0] if "[project.scripts]" in text else ""
    fields["scripts"] = re.findall(r'^([A-Za-z0-9_.-]+)\s*=\s*"([^"]+)"', scripts, re.M)
    return fields


def _metadata(project):
    return (
        "Metadata-Version: 2.1\n"
        "Name: {name}\nVersion: {version}\nSummary: {description}\n"
        "License: {license}\nClassifier: License :: OSI Approved :: Apache Software License\n"
        "Requires-Python: {requires-python}\n"
    ).format(**{k: v for k, v in project.items() if k != "scripts"})


def _license():
    with open(os.path.join(_ROOT, "LICENSE"), "rb") as f:
        return f.read()


def _package_files():
    root = os.path.join(_HERE, _PACKAGE)
    for directory, _, files in os.walk(root):
        if "__pycache__" in directory:
            continue
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(directory, name)
            yield path, os.path.relpath(path, _HERE)


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def _platform_tag():
    return re.sub(r"[-.]", "_", sysconfig.get_platform())


def _write_wheel(wheel_directory, entries, pure):
    """entries: (arcname, bytes, executable) triples."""
    project = _project()
    dist_info = "%s-%s.dist-info" % (project["name"], project["version"])
    tag = "py3-none-any" if pure else "py3-none-" + _platform_tag()
    wheel_name = "%s-%s-%s.whl" % (project["name"], project["version"], tag)
    entries = list(entries) + [
        (dist_info + "/METADATA", _metadata(project).encode(), False),
        (dist_info + "/LICENSE", _license(), False),
        (dist_info + "/entry_points.txt",
         ("[console_scripts]\n" + "".join("%s = %s\n" % s for s in project["scripts"])).encode(), False),
        (dist_info + "/WHEEL",
         ("Wheel-Version: 1.0\nGenerator: fragctl_build\nRoot-Is-Purelib: %s\nTag: %s\n"
          % ("true" if pure else "false", tag)).encode(), False),
    ]
    record = [_record_line(arcname, data) for arcname, data, _ in entries]
    record.append(dist_info + "/RECORD,,")
    entries.append((dist_info + "/RECORD", ("\n".join(record) + "\n").encode(), False))
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as wheel:
        for arcname, data, executable in entries:
            info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = ((0o755 if executable else 0o644) | stat.S_IFREG) << 16
            wheel.writestr(info, data)
    return wheel_name


def _build_dir(config_settings):
    chosen = (config_settings or {}).get("build-dir") or os.environ.get("FRAGCTL_WHEEL_BUILD_DIR")
    return os.path.abspath(chosen or os.path.join(_ROOT, "build-python"))


def _run(command):
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise RuntimeError("fragctl_build: %s failed (exit %d):\n%s"
                           % (" ".join(command), done.returncode, done.stdout[-8000:]))


def _cmake_build(build_dir):
    """Builds libfragctl.so and the CLI in build_dir; returns {relative path: bytes}."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("fragctl_build: cmake not found; the wheel carries libfragctl.so, built with CMake "
                           "(tools/install-deps.sh installs cmake and fragctl's libraries)")
    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        configure = [cmake, "-S", _ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                     "-DFRAGCTL_BUILD_TESTS=OFF", "-DFRAGCTL_BUILD_BENCHMARKS=OFF"]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        _run(configure)
    _run([cmake, "--build", build_dir, "--target", "fragctl", "fragctl_cli",
          "--parallel", str(os.cpu_count() or 1)])
    built = {}
    for relative, _ in _BUILT:
        with open(os.path.realpath(os.path.join(build_dir, relative)), "rb") as f:
            built[relative] = f.read()
    return built


def _version_module(version):
    return ('"""Written by the wheel build from CMakeLists.txt\'s project() version."""\n'
            "__version__ = %r\n" % version).encode()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    built = _cmake_build(_build_dir(config_settings))
    entries = []
    for path, arcname in _package_files():
        if os.path.basename(path) == "_version.py":
            continue
        with open(path, "rb") as f:
            entries.append((arcname.replace(os.sep, "/"), f.read(), False))
    entries.append((_PACKAGE + "/_version.py", _version_module(_cmake_version()), False))
    for relative, arcname in _BUILT:
        entries.append((arcname, built[relative], arcname.endswith("/bin/fragctl")))
    # The C API header, which the native PyTorch route compiles against (fragctl/_native).
    with open(os.path.join(_ROOT, "include", "fragctl", "fragctl.h"), "rb") as f:
        entries.append((_PACKAGE + "/include/fragctl/fragctl.h", f.read(), False))
    return _write_wheel(wheel_directory, entries, pure=False)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """An editable install: a .pth file that puts python/ on sys.path. The
    package then finds libfragctl.so in the checkout's build directories."""
    return _write_wheel(wheel_directory, [("fragctl_editable.pth", (_HERE + "\n").encode(), False)], pure=True)


def build_sdist(sdist_directory, config_settings=None):
    """The Python sources only: a wheel carrying libfragctl.so is built from
    the checkout (``pip install ./python``), where CMakeLists.txt is."""
    project = _project()
    base = "%s-%s" % (project["name"], project["version"])
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as sdist:
        for relative in ["pyproject.toml", "build_backend/fragctl_build.py"]:
            sdist.add(os.path.join(_HERE, relative), arcname=base + "/" + relative)
        for path, arcname in _package_files():
            sdist.add(path, arcname=base + "/" + arcname)
        for arcname, data in (("PKG-INFO", _metadata(project).encode()), ("LICENSE", _license())):
            info = tarfile.TarInfo(base + "/" + arcname)
            info.size = len(data)
            sdist.addfile(info, io.BytesIO(data))
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []
