"""Build hook: bundle the CMake-built liblnmlp into the package, so an installed wheel is
self-contained. Metadata lives in pyproject.toml.

The library copied is, in order: $LNMLP_LIBRARY (at build time), else
<repo>/build/release/src/liblnmlp.so.2 (symlinks resolved), with liblnmlp_xla.so from the same
directory when it was built. Its original path is also recorded in
lnmlp/_build_config.py as a fallback for the loader. Without a built library the package is
pure Python and finds the library at run time (see lnmlp/_lib.py).
"""

import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SONAME = "liblnmlp.so.2"  # the library's SONAME for the ABI version lnmlp/_lib.py checks (ABI_VERSION)
XLA_LIBRARY = "liblnmlp_xla.so"  # lnmlp.jax's XLA FFI handlers (bindings/python/xla_ffi)


def built_library():
    env = os.environ.get("LNMLP_LIBRARY")
    for path in ([env] if env else []) + [os.path.join(REPO, "build", "release", "src", SONAME)]:
        if path and os.path.exists(path):
            return os.path.abspath(path)
    return None


class BuildPy(build_py):
    def run(self):
        super().run()
        lib = built_library()
        pkg = os.path.join(self.build_lib, "lnmlp")
        if lib is None:
            sys.stderr.write("lnmlp: no built liblnmlp found; the package will look for it at run "
                             "time (LNMLP_LIBRARY, the build tree, the system loader)\n")
            return
        shutil.copyfile(os.path.realpath(lib), os.path.join(pkg, SONAME))
        # lnmlp.jax's XLA FFI handlers, built next to liblnmlp when CMake found jax; their RUNPATH
        # ($ORIGIN) finds the bundled liblnmlp.
        xla = os.path.join(os.path.dirname(lib), XLA_LIBRARY)
        if os.path.exists(xla):
            shutil.copyfile(os.path.realpath(xla), os.path.join(pkg, XLA_LIBRARY))
        with open(os.path.join(pkg, "_build_config.py"), "w") as f:
            f.write(f"# written by setup.py at build time\nLIBRARY_PATH = {lib!r}\n")


class BinaryDistribution(Distribution):
    """A platform wheel when it bundles the shared library."""

    def has_ext_modules(self):
        return built_library() is not None


setup(cmdclass={"build_py": BuildPy}, distclass=BinaryDistribution)
