"""Which of svcframe's modules run compiled here, and the switch that runs all of them interpreted.

The per-call hot paths are Python modules written for Cython's pure-Python mode: where the build found a C
compiler (setup.py), each module of svcframe/ with a ``.pxd`` beside its ``.py`` was also compiled from that
``.py`` into an extension module, which Python imports in its place. Where it was not, the ``.py`` runs: the
same source, interpreted, slower. ``SVCFRAME_PURE=1`` in the environment when svcframe is first imported makes
every svcframe module load from its ``.py`` even where it was compiled (the tests compare the two builds).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["PURE_ENV", "build", "compiled_modules", "pure_requested"]

#: The environment variable that runs every svcframe module interpreted ("1"); unset or "0": as built.
PURE_ENV = "SVCFRAME_PURE"
_HERE = Path(__file__).resolve().parent


def pure_requested() -> bool:
    """Whether the environment asks for the interpreted build (``SVCFRAME_PURE``)."""
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def compiled_modules() -> dict[str, bool]:
    """The modules the build compiles where it can (those with a ``.pxd``), by name, and whether each runs
    compiled in this process (it is imported here to tell)."""
    names = sorted(f"svcframe.{path.stem}" for path in _HERE.glob("*.pxd") if path.with_suffix(".py").exists())
    return {name: _is_extension(importlib.import_module(name)) for name in names}


def build() -> str:
    """ "compiled" when every compiled module runs compiled, "pure" when none does, else "partly compiled"."""
    state = compiled_modules().values()
    if state and all(state):
        return "compiled"
    return "partly compiled" if any(state) else "pure"


def _is_extension(module: ModuleType) -> bool:
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds svcframe's own top-level modules by their ``.py``, before the extension module built from it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        source = _HERE / f"{name}.py"
        if package != "svcframe" or not source.is_file():
            return None
        return importlib.util.spec_from_file_location(fullname, source)


def _apply_environment() -> None:
    """Install the source-first finder when the environment asks for the interpreted build (once)."""
    if pure_requested() and not any(isinstance(finder, _SourceFirst) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())


_apply_environment()
