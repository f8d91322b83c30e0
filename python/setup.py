"""Packaging with the library inside: `pip install ./python` and
`pip wheel ./python` copy libsquall.so into the package (squall/_libs/), so
the installed package needs neither SQUALL_LIBRARY nor the checkout.

The library bundled is $SQUALL_WHEEL_LIBRARY, else $SQUALL_LIBRARY, else the
first of the checkout's build/, build-wheel/ and build-cpu/ trees that has
one. Without any, the package is pure and finds an installed library
(meson install) at run time. scripts/build_wheel.sh builds a library that
needs only the C and C++ runtimes, for a wheel that installs anywhere of the
same kind.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def _library():
    for var in ("SQUALL_WHEEL_LIBRARY", "SQUALL_LIBRARY"):
        path = os.environ.get(var)
        if path:
            if not os.path.isfile(path):
                raise SystemExit(f"squall setup: {var}={path} is not a file")
            return os.path.realpath(path)
    for tree in ("build", "build-wheel", "build-cpu"):
        path = os.path.join(HERE, "..", tree, "src", "core", "libsquall.so")
        if os.path.isfile(path):
            return os.path.realpath(path)
    return None


LIBRARY = _library()


class BuildPy(build_py):
    def run(self):
        super().run()
        if LIBRARY is not None:
            dst = os.path.join(self.build_lib, "squall", "_libs")
            os.makedirs(dst, exist_ok=True)
            shutil.copyfile(LIBRARY, os.path.join(dst, "libsquall.so"))
            print(f"squall setup: bundled {LIBRARY}")


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # a platform wheel when it carries the library
        return LIBRARY is not None


cmdclass = {"build_py": BuildPy}
try:
    from wheel.bdist_wheel import bdist_wheel

    class BdistWheel(bdist_wheel):
        def get_tag(self):
            tag = super().get_tag()
            # ctypes only: any Python 3, one platform.
            return ("py3", "none", tag[2]) if LIBRARY is not None else tag

    cmdclass["bdist_wheel"] = BdistWheel
except ImportError:
    pass

setup(cmdclass=cmdclass, distclass=BinaryDistribution)
