"""The depot wheel's tag; everything else is in pyproject.toml.

Built from the source tree, the package is pure Python that finds an
installed libdepot_client (depot/_loader.py), and its wheel is py3-none-any.
When a libdepot_client.so has been copied into depot/ before the build, the
wheel ships it (package-data) and only runs where that library was built, so
it is a platform wheel, tagged py3-none-<platform>: no CPython ABI, since the
library is loaded with ctypes, not imported as an extension module.
"""

import pathlib

from setuptools import Distribution, setup

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1 uses the wheel package's
    from wheel.bdist_wheel import bdist_wheel

BUNDLED_LIBRARY = (
    pathlib.Path(__file__).resolve().parent / "depot" / "libdepot_client.so")


class DistributionWithLibrary(Distribution):
    """Platform-specific exactly when it ships the library."""

    def has_ext_modules(self):
        return BUNDLED_LIBRARY.is_file()


class PythonIndependentTag(bdist_wheel):
    """py3-none-<platform> rather than the interpreter's tags."""

    def get_tag(self):
        python, abi, platform = super().get_tag()
        if not self.root_is_pure:
            python, abi = "py3", "none"
        return python, abi, platform


setup(distclass=DistributionWithLibrary,
      cmdclass={"bdist_wheel": PythonIndependentTag})
