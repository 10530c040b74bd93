"""A minimal PEP 517 build backend for the pure-Python fragctl package.

It writes the wheel itself (a zip with the package, METADATA, WHEEL and
RECORD), so `pip install ./python` needs no setuptools and no network. The
wheel records the source tree it was built from (fragctl/_location.py) so
the installed package can find libfragctl.so in that checkout's build
directories (fragctl/_capi.py says where it looks).
"""
import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
_PACKAGE = "fragctl"


def _project():
    with open(os.path.join(_HERE, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    project = text.split("[project]", 1)[1]
    fields = {}
    for key in ("name", "version", "description", "requires-python"):
        match = re.search(r'^%s\s*=\s*"([^"]*)"' % re.escape(key), project, re.M)
        fields[key] = match.group(1) if match else ""
    return fields


def _metadata(project):
    return (
        "Metadata-Version: 2.1\n"
        "Name: {name}\nVersion: {version}\nSummary: {description}\n"
        "Requires-Python: {requires-python}\n"
    ).format(**project)


def _package_files():
    root = os.path.join(_HERE, _PACKAGE)
    for directory, _, files in os.walk(root):
        if "__pycache__" in directory:
            continue
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")) or name == "_location.py":
                continue
            path = os.path.join(directory, name)
            yield path, os.path.relpath(path, _HERE)


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def _write_wheel(wheel_directory, entries):
    project = _project()
    dist_info = "%s-%s.dist-info" % (project["name"], project["version"])
    wheel_name = "%s-%s-py3-none-any.whl" % (project["name"], project["version"])
    entries = list(entries) + [
        (dist_info + "/METADATA", _metadata(project).encode()),
        (dist_info + "/WHEEL",
         b"Wheel-Version: 1.0\nGenerator: fragctl_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    record = [_record_line(arcname, data) for arcname, data in entries]
    record.append(dist_info + "/RECORD,,")
    entries.append((dist_info + "/RECORD", ("\n".join(record) + "\n").encode()))
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as wheel:
        for arcname, data in entries:
            wheel.writestr(arcname, data)
    return wheel_name


def _location_module():
    source_tree = os.path.dirname(_HERE)
    return ('"""Written by the build: the checkout this package was installed from."""\n'
            "source_tree = %r\n" % source_tree).encode()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    entries = []
    for path, arcname in _package_files():
        with open(path, "rb") as f:
            entries.append((arcname.replace(os.sep, "/"), f.read()))
    entries.append((_PACKAGE + "/_location.py", _location_module()))
    return _write_wheel(wheel_directory, entries)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """An editable install: a .pth file that puts python/ on sys.path."""
    return _write_wheel(wheel_directory, [("fragctl_editable.pth", (_HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    project = _project()
    base = "%s-%s" % (project["name"], project["version"])
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as sdist:
        for relative in ["pyproject.toml", "build_backend/fragctl_build.py"]:
            sdist.add(os.path.join(_HERE, relative), arcname=base + "/" + relative)
        for path, arcname in _package_files():
            sdist.add(path, arcname=base + "/" + arcname)
        info = tarfile.TarInfo(base + "/PKG-INFO")
        data = _metadata(project).encode()
        info.size = len(data)
        sdist.addfile(info, io.BytesIO(data))
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []
