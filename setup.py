"""Build the native kernels in crawlerd/_native (Cython).

Every ``crawlerd/_native/*.pyx`` becomes ``crawlerd._native.<name>``. Set
``CRAWLERD_DEBUG_BUILD=1`` for a debug build: ``-O0 -g`` and Cython bounds and
wraparound checks switched back on.
"""

import glob
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("CRAWLERD_DEBUG_BUILD", "") not in ("", "0")

compile_args = ["-O0", "-g"] if DEBUG else ["-O3"]
directives = {
    "language_level": "3",
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "cdivision": not DEBUG,
    "initializedcheck": DEBUG,
    "embedsignature": True,
}

extensions = [
    Extension(
        "crawlerd._native." + os.path.splitext(os.path.basename(path))[0],
        [path],
        include_dirs=[numpy.get_include(), "crawlerd/_native"],   # bits.h: helpers both kernels share
        depends=sorted(glob.glob("crawlerd/_native/*.h") + glob.glob("crawlerd/_native/*.pxd")),
        extra_compile_args=compile_args,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for path in sorted(glob.glob("crawlerd/_native/*.pyx"))
]

setup(ext_modules=cythonize(extensions, compiler_directives=directives, quiet=True))
