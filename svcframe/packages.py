"""The import names of the packages the svcframe distribution ships, and imports by name that accept both.

The repository keeps the application beside the framework (``svcframe/``, ``providers/``, ``selftest/``); the
wheel installs the application under names of its own, so that it never takes a name another distribution
owns (the package index has projects named ``providers`` and ``selftest``). pyproject.toml maps them when the
wheel is built (setuptools' ``package-dir``)::

    repository     installed (wheel)
    providers      svcframe_providers
    selftest       svcframe_selftest

An editable install (``pip install -e . --config-settings editable_mode=compat``, the tests: tools/env.sh) puts
the repository on ``sys.path``: there only the repository's names exist. Whatever names a
module, a config's ``libraries`` (``"providers.kv"``, ``"selftest.provider"``), an entry point of
pyproject.toml (``svcframe_selftest.cli.roofline:roofline``) or ``--arg-generator
selftest.generators:kv_put``, is imported through :func:`import_module`, which tries the installed name first,
then the repository's: each environment has one copy of each module, under the one name it has. Code inside
the packages imports its own modules relatively and names itself by ``__spec__.name`` (``python -m`` commands
it launches, the forkserver's preloads), so it runs under either name.

svcframe names these packages only here, as strings: it never imports them (tests/test_layers.py).
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: Top-level packages of the svcframe distribution whose installed name differs from the repository's:
#: repository name -> installed name (pyproject.toml's ``[tool.setuptools] package-dir``).
INSTALLED_NAMES = {"providers": "svcframe_providers", "selftest": "svcframe_selftest"}
_REPOSITORY_NAMES = {installed: repository for repository, installed in INSTALLED_NAMES.items()}


def candidates(name: str) -> list[str]:
    """The names module ``name`` may be imported under, in the order :func:`import_module` tries them:
    ``"selftest.provider"`` -> ``["svcframe_selftest.provider", "selftest.provider"]``; a module of no
    renamed package -> ``[name]``."""
    top, dot, rest = name.partition(".")
    installed = INSTALLED_NAMES.get(top, top)
    repository = _REPOSITORY_NAMES.get(installed)
    if repository is None:
        return [name]
    return [installed + dot + rest, repository + dot + rest]


def import_module(name: str) -> ModuleType:
    """``importlib.import_module(name)`` where the installed name and the repository's name of a package of
    the svcframe distribution are one: the first of :func:`candidates` whose top-level package exists.

    Raises:
        ModuleNotFoundError: no candidate's top-level package exists (the error of the one ``name`` gives),
            or the package exists and lacks the module.
        ImportError, or what the module raises: the module fails to import.
    """
    names = candidates(name)
    missing: dict[str, ModuleNotFoundError] = {}
    for candidate in names:
        try:
            return importlib.import_module(candidate)
        except ModuleNotFoundError as exc:
            if exc.name != candidate.partition(".")[0]:
                raise  # the package is here and something under it is missing: that is the answer
            missing[candidate] = exc
    raise missing.get(name, missing[names[-1]])
