"""The distribution: the wheel and the sdist this checkout builds, file by file, and the two names of
the packages svcframe ships (``providers``/``selftest`` in the repository, ``svcframe_providers``/
``svcframe_selftest`` in the wheel) working the repository's way. tools/wheel_smoke.sh (run by .ci/run) installs
the wheel into a fresh venv and runs it away from the checkout."""

from __future__ import annotations

import ast
import email
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from svcframe.packages import INSTALLED_NAMES, candidates, import_module
from svcframe.provider import load_library

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGES = ("svcframe", *INSTALLED_NAMES)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel of this checkout (setuptools and Cython from the venv: no download)."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    return {"wheel": next(out.glob("svcframe-*.whl")), "sdist": next(out.glob("svcframe-*.tar.gz"))}


def _repository_files(package: str) -> set[str]:
    """What git tracks or would track under ``package`` (not caches), relative to the repository."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", package], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout.split()  # fmt: skip
    return {name for name in listed if (ROOT / name).is_file()}


pytestmark = pytest.mark.one_interpreter


def test_the_wheel_installs_the_packages_under_their_own_names(built: dict[str, Path]) -> None:
    names = set(zipfile.ZipFile(built["wheel"]).namelist())
    version = PYPROJECT["project"]["version"]
    dist_info = f"svcframe-{version}.dist-info"
    assert {name.split("/")[0] for name in names} == {"svcframe", "svcframe_providers", "svcframe_selftest", dist_info}
    for package in PACKAGES:
        installed = INSTALLED_NAMES.get(package, package)
        expected = {installed + name.removeprefix(package) for name in _repository_files(package)}
        assert expected <= names, f"missing from the wheel: {sorted(expected - names)}"
    assert {"svcframe/py.typed", "svcframe_selftest/selftest.json", f"{dist_info}/licenses/LICENSE"} <= names


def test_the_wheels_metadata(built: dict[str, Path]) -> None:
    with zipfile.ZipFile(built["wheel"]) as wheel:
        dist_info = next(n.split("/")[0] for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(wheel.read(f"{dist_info}/METADATA"))
        entry_points = wheel.read(f"{dist_info}/entry_points.txt").decode()
        names = set(wheel.namelist())
    assert metadata["Version"] == PYPROJECT["project"]["version"]
    assert metadata["License-Expression"] == "BSD-3-Clause"
    classifiers = metadata.get_all("Classifier")
    assert {f"Programming Language :: Python :: 3.{minor}" for minor in (11, 12, 13)} <= set(classifiers)
    assert "Typing :: Typed" in classifiers and metadata.get_all("Project-URL")
    # a server needs none of the extras: no hard requirement on them
    hard = [r for r in metadata.get_all("Requires-Dist") if "extra ==" not in r]
    for optional in ("pyhwloc", "matplotlib", "mpi4py", "mpich", "opentelemetry", "pyzmq", "grpcio"):
        assert not [r for r in hard if r.startswith(optional)], f"{optional} is a hard requirement: {hard}"
    # every entry point names a module the wheel holds
    for line in entry_points.splitlines():
        if "=" in line:
            module = line.split("=", 1)[1].strip().split(":")[0].replace(".", "/")
            assert {f"{module}.py", f"{module}/__init__.py"} & names, line


def test_the_sdist_holds_the_repository_layout(built: dict[str, Path]) -> None:
    with tarfile.open(built["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"LICENSE", "pyproject.toml", "README.md", "selftest/selftest.json", "svcframe/py.typed"} <= names
    assert {"providers/kv.py", "selftest/provider.py", "tests/test_wheel.py"} <= names
    assert not [n for n in names if n.startswith(("out/", ".venv", "svcframe_"))]


@pytest.mark.parametrize("package", list(INSTALLED_NAMES))
def test_the_renamed_packages_never_name_themselves(package: str) -> None:
    """Their modules import one another relatively and launch themselves by ``__spec__.name``: an absolute
    ``import selftest.x`` or a ``-m selftest.x`` would break the wheel (svcframe_selftest)."""
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value] if node.value.startswith(f"{package}.") and " " not in node.value else []
                names = [n for n in names if not n.endswith(".json")]
                if names and path.name == "attach.py" and node.value == "selftest.provider":
                    names = []  # sent to a server as a library name: svcframe.packages resolves it
            else:
                continue
            own = [n for n in names if n == package or n.startswith(f"{package}.")]
            assert not own, f"{path.relative_to(ROOT)}:{node.lineno}: names its own package: {own}"


def test_either_name_imports_the_one_module() -> None:
    import providers.kv
    import selftest.provider

    assert import_module("svcframe_selftest.provider") is selftest.provider
    assert import_module("selftest.provider") is selftest.provider
    assert import_module("svcframe_providers.kv") is providers.kv
    assert "svcframe_selftest" not in sys.modules  # the repository's names only: one copy of each module
    assert load_library("svcframe_providers.kv") == load_library("providers.kv") == ["kv"]
    assert candidates("counter") == ["counter"]
    assert candidates("selftest.generators") == ["svcframe_selftest.generators", "selftest.generators"]


def test_a_missing_module_is_named_as_the_user_wrote_it() -> None:
    with pytest.raises(ModuleNotFoundError) as missing_package:
        import_module("no_such_library_here")
    assert missing_package.value.name == "no_such_library_here"
    with pytest.raises(ModuleNotFoundError) as missing_module:
        import_module("svcframe_selftest.no_such_module")
    assert missing_module.value.name == "selftest.no_such_module"


def test_the_plugins_load_from_the_installed_names_in_the_editable_install() -> None:
    """pyproject.toml's entry points name svcframe_selftest; the editable install has only selftest."""
    proc = subprocess.run([sys.executable, "-m", "svcframe", "selftest", "config"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=True)  # fmt: skip
    assert proc.stdout.strip() == str(ROOT / "selftest" / "selftest.json") and not proc.stderr
