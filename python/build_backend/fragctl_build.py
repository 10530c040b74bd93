"""The PEP 517 build backend of the fragctl package, driving fragctl's CMake build.

``pip wheel ./python`` and ``pip install ./python`` call ``build_wheel``, which

1. configures fragctl with CMake into a build directory (once: Release,
   ``FRAGCTL_SELF_CONTAINED=ON``, no tests, no benchmarks), builds it and
   installs it into a staging prefix;
2. copies in what the binaries load beyond the system libraries a
   manylinux wheel may assume (``_SYSTEM_LIBRARIES``): Abseil's, spdlog's
   and fmt's shared libraries, renamed as auditwheel does (``_bundle``);
   then checks every
   ELF file it will ship: each may need only those system libraries and the
   wheel's own files, found through ``$ORIGIN`` run paths; anything else
   stops the build (docs/packaging.md says why the rule is this one);
3. writes one wheel, tagged ``py3-none-manylinux_2_N_x86_64`` where N is the
   newest glibc symbol version its binaries use (the real glibc floor), with
   the Python package, ``fragctl/lib/`` (libfragctl.so, the LD_PRELOAD shim
   libfragctl_preload.so, the pinned host tier's libfragctl_jemalloc.so),
   ``fragctl/bin/fragctl``, the C headers the native PyTorch route compiles
   against (``fragctl/include``), ``fragctl/_version.py`` (CMakeLists.txt's
   ``project()`` version) and the LICENSE.

``FRAGCTL_SELF_CONTAINED`` gives libfragctl.so no version suffix and
``$ORIGIN`` run paths; jemalloc lives in libfragctl_jemalloc.so with its
symbols hidden. Nothing in the wheel names the checkout. It needs no
setuptools and no network; ``patchelf`` renames the bundled libraries.

Where it builds: the config setting ``build-dir`` (``pip wheel
--config-settings build-dir=PATH ./python``; a relative PATH is taken from
the checkout's root, not from python/), else ``FRAGCTL_WHEEL_BUILD_DIR``,
else ``build-wheel/`` in the checkout. An existing build directory is built
as it is configured, and must have ``FRAGCTL_SELF_CONTAINED=ON``.
``FRAGCTL_WHEEL_CMAKE_ARGS`` adds configure arguments (CI passes
``-DFRAGCTL_WERROR=ON``).
"""
import base64
import hashlib
import io
import os
import re
import shlex
import shutil
import stat
import subprocess
import sysconfig
import tarfile
import tempfile
import zipfile

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
_ROOT = os.path.dirname(_HERE)  # the checkout: CMakeLists.txt
_PACKAGE = "fragctl"
# What the wheel carries from the CMake install, and where: (installed path,
# path in the wheel, required). The jemalloc library is built where
# Debian's libjemalloc-dev is found (the pinned host tier falls back to size
# classes without it).
_INSTALLED = [("lib/libfragctl.so", _PACKAGE + "/lib/libfragctl.so", True),
              ("lib/libfragctl_preload.so", _PACKAGE + "/lib/libfragctl_preload.so", True),
              ("lib/libfragctl_jemalloc.so", _PACKAGE + "/lib/libfragctl_jemalloc.so", False),
              ("bin/fragctl", _PACKAGE + "/bin/fragctl", True),
              ("include/fragctl/fragctl.h", _PACKAGE + "/include/fragctl/fragctl.h", True),
              ("include/fragctl/checkpoint/checkpoint.h", _PACKAGE + "/include/fragctl/checkpoint/checkpoint.h", True),
              ("include/fragctl/zero3/zero3.h", _PACKAGE + "/include/fragctl/zero3/zero3.h", False)]
# The libraries a manylinux wheel may need from the system (PEP 600 and
# auditwheel's policy: glibc's own, libgcc_s, libstdc++, libz); everything
# else must be inside the wheel.
_SYSTEM_LIBRARIES = frozenset([
    "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libgcc_s.so.1",
    "libstdc++.so.6", "libz.so.1", "ld-linux-x86-64.so.2"])
# The torch versions the routes of fragctl.torch need (docs/pytorch.md).
_TORCH_REQUIREMENT = "torch>=2.0"


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
        "Classifier: Operating System :: POSIX :: Linux\n"
        "Classifier: Environment :: GPU :: NVIDIA CUDA\n"
        "Requires-Python: {requires-python}\n"
        "Provides-Extra: torch\n"
        "Requires-Dist: {torch}; extra == \"torch\"\n"
        "\n"
        "fragctl.torch.enable() needs {torch} (the pluggable route; the native route compiles against "
        "the installed torch and was tested with 2.11). `fragctl run -- COMMAND` runs any program "
        "with the LD_PRELOAD shim the wheel carries.\n"
    ).format(torch=_TORCH_REQUIREMENT, **{k: v for k, v in project.items() if k != "scripts"})


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


def _run_text(command, env=None):
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError("fragctl_build: %s failed (exit %d):\n%s"
                           % (" ".join(command), done.returncode, done.stdout[-8000:]))
    return done.stdout


def _is_elf(data):
    return data[:4] == b"\x7fELF"


def _needed(path):
    """The NEEDED entries and RUNPATH of an ELF file (readelf -d)."""
    needed, runpath = [], ""
    for line in _run_text(["readelf", "-d", "-W", path]).splitlines():
        match = re.search(r"\((NEEDED|RUNPATH|RPATH)\)\s+.*\[(.*)\]", line)
        if match and match.group(1) == "NEEDED":
            needed.append(match.group(2))
        elif match:
            runpath = match.group(2)
    return needed, runpath


def _glibc_floor(path):
    """The newest GLIBC_2.N symbol version an ELF file needs (readelf -V), as N."""
    versions = [int(v) for v in re.findall(r"Name: GLIBC_2\.([0-9]+)", _run_text(["readelf", "-V", "-W", path]))]
    return max(versions, default=17)


def _dependencies(path):
    """{soname: resolved path} of every shared library loading ``path``
    loads, its whole closure (ldd)."""
    found = {}
    for line in _run_text(["ldd", path]).splitlines():
        match = re.match(r"\s*(\S+) => (/\S+) \(", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def _bundle(files, staged):
    """Copies into the wheel's lib/ folder every library that files (their
    whole closure) need beyond _SYSTEM_LIBRARIES and the wheel's own, as
    auditwheel does: renamed with a hash of its contents, so that no other
    copy of the same soname in a process can stand in for it, its soname
    set to the new name, found through $ORIGIN; every ELF file that needs it
    is patched to the new name. Returns {wheel path: staged path} of the
    copies. files is {wheel path: staged path}, patched in place."""
    own = {os.path.basename(arcname) for arcname in files}
    elves = {arcname: path for arcname, path in files.items() if _elf_file(path)}
    wanted = {}
    for path in elves.values():
        for soname, resolved in _dependencies(path).items():
            if soname not in _SYSTEM_LIBRARIES and soname not in own:
                wanted[soname] = resolved
    if not wanted:
        return {}
    patchelf = shutil.which("patchelf")
    if patchelf is None:
        raise RuntimeError("fragctl_build: patchelf not found; it renames the libraries the wheel carries "
                           "(%s); install it (Debian: apt-get install patchelf)" % ", ".join(sorted(wanted)))
    renamed, bundled = {}, {}
    for soname, resolved in sorted(wanted.items()):
        with open(resolved, "rb") as f:
            data = f.read()
        stem, _, rest = soname.partition(".so")
        new = "%s-%s.so%s" % (stem, hashlib.sha256(data).hexdigest()[:8], rest)
        arcname = _PACKAGE + "/lib/" + new
        path = os.path.join(staged, arcname)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o755)
        _run([patchelf, "--set-soname", new, "--set-rpath", "$ORIGIN", path])
        renamed[soname] = new
        bundled[arcname] = path
    for path in list(elves.values()) + list(bundled.values()):
        needed, _ = _needed(path)
        replace = [arg for name in needed if name in renamed for arg in ("--replace-needed", name, renamed[name])]
        if replace:
            _run([patchelf] + replace + [path])
    return bundled


def _elf_file(path):
    with open(path, "rb") as f:
        return _is_elf(f.read(4))


def _check_elves(files):
    """files: {wheel path: installed path}. Raises unless every ELF file needs
    only system libraries of _SYSTEM_LIBRARIES or a file of the wheel found
    through an $ORIGIN run path; returns the glibc floor of them all."""
    shipped = {os.path.basename(arcname): arcname for arcname in files}
    floor = 17
    problems = []
    for arcname, path in sorted(files.items()):
        if not _elf_file(path):
            continue
        floor = max(floor, _glibc_floor(path))
        needed, runpath = _needed(path)
        searched = [os.path.normpath(os.path.join(os.path.dirname(arcname), entry.replace("$ORIGIN", ".")))
                    for entry in runpath.split(":") if entry.startswith("$ORIGIN")]
        for name in needed:
            if name in _SYSTEM_LIBRARIES:
                continue
            inside = shipped.get(name)
            if inside is None or os.path.dirname(inside) not in searched:
                problems.append("%s needs %s (run path %r)" % (arcname, name, runpath))
    if problems:
        raise RuntimeError("fragctl_build: the wheel would need libraries it does not carry:\n  "
                           + "\n  ".join(problems)
                           + "\nBuild with -DFRAGCTL_SELF_CONTAINED=ON (docs/packaging.md).")
    return floor


def _platform_tag(glibc_floor):
    machine = sysconfig.get_platform().split("-")[-1]
    return "manylinux_2_%d_%s" % (glibc_floor, machine)


def _write_wheel(wheel_directory, entries, platform=None):
    """entries: (arcname, bytes, executable) triples; platform: the platform
    tag, None for a pure wheel."""
    project = _project()
    dist_info = "%s-%s.dist-info" % (project["name"], project["version"])
    pure = platform is None
    tag = "py3-none-any" if pure else "py3-none-" + platform
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
    # pip runs the backend in python/; a relative path means the checkout's.
    return os.path.normpath(os.path.join(_ROOT, chosen or "build-wheel"))


def _run(command, env=None):
    _run_text(command, env)


def _build_tool_environment():
    """The environment CMake, and what it starts, run in: this process's,
    without PYTHONPATH. pip builds a package in an isolated environment by
    putting a sitecustomize on PYTHONPATH that takes site-packages off
    sys.path in every Python started below it; cmake and ninja installed
    with pip into the user's venv (common beside torch) are Python scripts
    that import themselves from there, so under it they die with "No module
    named 'cmake'". fragctl's build runs no Python module of its own."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def _cmake_cache(build_dir):
    path = os.path.join(build_dir, "CMakeCache.txt")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _cmake_install(build_dir, prefix):
    """Configures (once), builds and installs fragctl into prefix."""
    env = _build_tool_environment()
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("fragctl_build: cmake not found; the wheel carries libfragctl.so, built with CMake "
                           "(tools/install-deps.sh installs cmake and fragctl's libraries)")
    cache = _cmake_cache(build_dir)
    if cache is None:
        configure = [cmake, "-S", _ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                     "-DFRAGCTL_SELF_CONTAINED=ON", "-DCMAKE_INSTALL_LIBDIR=lib",
                     "-DFRAGCTL_BUILD_TESTS=OFF", "-DFRAGCTL_BUILD_BENCHMARKS=OFF"]
        configure += shlex.split(os.environ.get("FRAGCTL_WHEEL_CMAKE_ARGS", ""))
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        _run(configure, env)
    elif not re.search(r"^FRAGCTL_SELF_CONTAINED:BOOL=(ON|TRUE|1)$", cache, re.M):
        raise RuntimeError("fragctl_build: %s was configured without FRAGCTL_SELF_CONTAINED=ON, so its "
                           "libraries need Abseil, spdlog and fmt from the system; name another build "
                           "directory (--config-settings build-dir=PATH), or reconfigure this one with "
                           "-DFRAGCTL_SELF_CONTAINED=ON" % build_dir)
    _run([cmake, "--build", build_dir, "--parallel", str(os.cpu_count() or 1)], env)
    _run([cmake, "--install", build_dir, "--prefix", prefix], env)


def _version_module(version):
    return ('"""Written by the wheel build from CMakeLists.txt\'s project() version."""\n'
            "__version__ = %r\n" % version).encode()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    entries = []
    for path, arcname in _package_files():
        if os.path.basename(path) == "_version.py":
            continue
        with open(path, "rb") as f:
            entries.append((arcname.replace(os.sep, "/"), f.read(), False))
    entries.append((_PACKAGE + "/_version.py", _version_module(_cmake_version()), False))
    with tempfile.TemporaryDirectory(prefix="fragctl-wheel-") as work:
        prefix, staged = os.path.join(work, "prefix"), os.path.join(work, "staged")
        _cmake_install(_build_dir(config_settings), prefix)
        files = {}
        for installed, arcname, required in _INSTALLED:
            path = os.path.join(prefix, installed)
            if not os.path.exists(path):
                if required:
                    raise RuntimeError("fragctl_build: the CMake install has no %s" % installed)
                continue
            files[arcname] = os.path.join(staged, arcname)
            os.makedirs(os.path.dirname(files[arcname]), exist_ok=True)
            shutil.copyfile(os.path.realpath(path), files[arcname])
            shutil.copymode(os.path.realpath(path), files[arcname])
        files.update(_bundle(files, staged))
        floor = _check_elves(files)
        for arcname, path in sorted(files.items()):
            with open(path, "rb") as f:
                data = f.read()
            entries.append((arcname, data, arcname.endswith("/bin/fragctl")))
    return _write_wheel(wheel_directory, entries, platform=_platform_tag(floor))


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """An editable install: a .pth file that puts python/ on sys.path. The
    package then finds libfragctl.so in the checkout's build directories."""
    return _write_wheel(wheel_directory, [("fragctl_editable.pth", (_HERE + "\n").encode(), False)])


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
