"""The depot wheel (client/python): pure Python that finds an installed
libdepot_client, or platform-tagged when it ships one; typed (PEP 561); and,
once installed, loading the library through the system loader by its SONAME
(docs/packaging.md). Builds with pip offline, from a copy of the package."""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

import depot

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE_SOURCE = REPO_ROOT / "client" / "python"


def project_version():
    """The VERSION of project() in the top-level CMakeLists.txt."""
    text = (REPO_ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(depot VERSION ([0-9.]+)", text).group(1)


def built_library():
    """The real file of the library under test (not a link to it)."""
    library = os.environ.get("DEPOT_CLIENT_LIBRARY") or str(
        REPO_ROOT / "build" / "client" / "libdepot_client.so")
    path = pathlib.Path(library).resolve()
    if not path.is_file():
        pytest.fail(f"libdepot_client not found at {library}: build it and "
                    f"set DEPOT_CLIENT_LIBRARY", pytrace=False)
    return path


def build_wheel(tmp_path, bundle_library=False):
    """Builds the wheel of a clean copy of client/python and returns it."""
    source = tmp_path / "source"
    shutil.copytree(PACKAGE_SOURCE, source, ignore=shutil.ignore_patterns(
        "build", "dist", "*.egg-info", "__pycache__", "*.so"))
    if bundle_library:
        shutil.copyfile(built_library(), source / "depot" / "libdepot_client.so")
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps",
         "--no-build-isolation", "--no-index", "--quiet", "--wheel-dir",
         str(out), str(source)],
        check=True, env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"))
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_package_version_is_the_projects():
    assert depot.__version__ == project_version()


def test_wheel_without_a_library_is_pure_and_typed(tmp_path):
    wheel = build_wheel(tmp_path)
    assert wheel.name == f"depot-{project_version()}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert "depot/py.typed" in names
    assert "depot/client.py" in names
    assert not [name for name in names if ".so" in name]


def test_wheel_with_a_bundled_library_is_tagged_for_the_platform(tmp_path):
    wheel = build_wheel(tmp_path, bundle_library=True)
    platform = re.sub(r"[-.]", "_", sysconfig.get_platform())
    assert wheel.name == (
        f"depot-{project_version()}-py3-none-{platform}.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert "depot/libdepot_client.so" in archive.namelist()
        wheel_info = archive.read(
            f"depot-{project_version()}.dist-info/WHEEL").decode()
    assert "Root-Is-Purelib: false" in wheel_info


def test_installed_wheel_loads_the_library_by_its_soname(tmp_path):
    wheel = build_wheel(tmp_path)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # a pure wheel installs so
    # A library directory as the runtime package leaves it: the SONAME only,
    # no unversioned development link.
    library_dir = tmp_path / "lib"
    library_dir.mkdir()
    (library_dir / "libdepot_client.so.0").symlink_to(built_library())
    env = {key: value for key, value in os.environ.items()
           if key not in ("DEPOT_CLIENT_LIBRARY", "PYTHONPATH")}
    env.update(PYTHONPATH=str(site), LD_LIBRARY_PATH=str(library_dir))
    loaded = subprocess.run(
        [sys.executable, "-c",
         "import depot, depot._capi as capi; "
         "assert depot.__file__.startswith(" + repr(str(site)) + "); "
         "print(capi.lib()._name)"],
        check=True, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert loaded.stdout.strip() == "libdepot_client.so.0"
