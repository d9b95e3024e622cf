"""Build hook: compile svcframe's optional C twins of its per-call hot paths (svcframe/_speedups.c).

``pip install .`` (a wheel) and ``pip install -e .`` (editable: built in place, next to the source) compile it
with the C compiler the interpreter was built with (sysconfig's CC) against the interpreter's own headers: no
extra build dependency. Without a compiler, or when the compile fails, the build says so in one line and the
package stays pure Python (svcframe.wire.PURE is then True; everything works, calls cost more CPU).
``SVCFRAME_PURE_BUILD=1`` skips the compile on purpose.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = "svcframe/_speedups.c"


def compile_speedups(root: str, output: str) -> str | None:
    """Compile SOURCE under ``root`` into the extension module ``output``; None, or why it failed."""
    source = os.path.join(root, SOURCE)
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python.h in {include} (install the interpreter's development headers)"
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")
    if not shutil.which(compiler[0]):
        return f"no C compiler ({compiler[0]} not found)"
    with open(source, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    command = [
        *compiler, "-shared", "-fPIC", "-O2", "-fno-strict-aliasing", "-Wall", f"-I{include}",
        f'-DSVCFRAME_SOURCE_SHA256="{digest}"', source, "-o", output,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"{shlex.join(command[:1])} failed: {last}"
    return None


class SpeedupsBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Adds svcframe/_speedups<EXT_SUFFIX> to the wheel (or, editable, builds it in the source tree)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or os.environ.get("SVCFRAME_PURE_BUILD", "") not in ("", "0"):
            return
        name = "svcframe/_speedups" + sysconfig.get_config_var("EXT_SUFFIX")
        if version == "editable":
            output = os.path.join(self.root, name)  # found through the editable path, beside the sources
        else:
            self._tmp = tempfile.mkdtemp(prefix="svcframe-build-")
            output = os.path.join(self._tmp, os.path.basename(name))
        failure = compile_speedups(self.root, output)
        if failure is not None:
            self.app.display_warning(f"svcframe: building pure Python, without the compiled decoder: {failure}")
            return
        if version != "editable":
            build_data["force_include"][output] = name
            build_data["pure_python"] = False
            build_data["infer_tag"] = True  # cp311-cp311-linux_x86_64: the module is for this interpreter

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
