"""svcframe's compiled modules, built by setuptools and Cython (pyproject.toml holds everything else).

The per-call hot paths are written once, as Python, in Cython's pure-Python mode: every module of svcframe/
that has a ``.pxd`` beside its ``.py`` is compiled from that ``.py`` (the ``.pxd`` declares its C types), and
the same ``.py`` runs interpreted wherever the module was not compiled. ``svcframe --version`` says which.

The compiler and its flags are setuptools' own: the interpreter's (sysconfig: CC, CFLAGS with -DNDEBUG and
-O3, LDSHARED), with ``CC``, ``CFLAGS`` and ``LDFLAGS`` from the environment honoured (the sanitizer build in
.ci/run sets them). Without a C compiler each module's compile fails, setuptools says so, and the package is
pure Python. ``SVCFRAME_PURE_BUILD=1`` builds no module (a pure-Python wheel, on purpose).
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent

#: Cython's directives for every compiled module. Types come from the .pxd files alone (annotation_typing
#: off: an annotation means in the compiled module what it means interpreted); bounds and negative indices
#: are checked unless a function's declaration in its .pxd turns the check off.
DIRECTIVES = {"language_level": 3, "annotation_typing": False, "embedsignature": True}


def extensions() -> list[Extension]:
    if os.environ.get("SVCFRAME_PURE_BUILD", "") not in ("", "0"):
        return []
    from Cython.Build import cythonize

    # (a .pxd without a .py, svcframe/_bytes.pxd, is Cython's alone: cimported, never a module)
    modules = sorted(p for p in (path.with_suffix(".py") for path in (ROOT / "svcframe").glob("*.pxd")) if p.exists())
    extensions = [Extension(f"svcframe.{path.stem}", [str(path.relative_to(ROOT))], optional=True) for path in modules]
    return cythonize(  # type: ignore[no-any-return]
        extensions, compiler_directives=DIRECTIVES, build_dir="build/cython", nthreads=os.cpu_count() or 1
    )


class ParallelBuildExt(build_ext):  # type: ignore[misc]
    """build_ext compiling the modules on every core unless told otherwise (``-j N``): pip's builds give none."""

    def finalize_options(self) -> None:
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1
        super().finalize_options()


setup(ext_modules=extensions(), cmdclass={"build_ext": ParallelBuildExt})
