"""Build hook: compiles ``fastrecover/_fastpoll.c`` (Consumer.poll()'s steady path in C).

The extension is an accelerator with a pure-Python twin (fastrecover/_accel.py), but a build
that silently drops it would silently miss the steady-state speed, so a failed compile fails
the install with the compiler's message.  ``FASTRECOVER_PURE_PYTHON=1`` in the build's
environment skips it on purpose (a platform without a C compiler).

An editable install (``pip install -e``, what ``make venv`` does) puts the module next to its
source, where the editable path finds it; a wheel gets it as a platform-tagged file.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

_SOURCE = Path("fastrecover") / "_fastpoll.c"
_MODULE = "fastrecover._fastpoll"
_PURE_ENV = "FASTRECOVER_PURE_PYTHON"


class FastPollBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        if os.environ.get(_PURE_ENV, "").strip().lower() not in ("", "0", "false", "no"):
            self.app.display_warning(f"{_PURE_ENV} is set: {_MODULE} is not built, Consumer.poll() runs in Python")
            return
        root = Path(self.root)
        built = _compile(root)
        target = f"fastrecover/{built.name}"
        if version == "editable":
            shutil.copy2(built, root / target)
        else:
            build_data["force_include"][str(built)] = target
        build_data["pure_python"] = False
        build_data["infer_tag"] = True


def _compile(root: Path) -> Path:
    """The extension, built by setuptools' build_ext (the interpreter's own compiler and flags)."""
    from setuptools import Distribution, Extension

    out = Path(tempfile.mkdtemp(prefix="fastrecover-build-"))
    ext = Extension(_MODULE, sources=[str(root / _SOURCE)], extra_compile_args=["-O2"] if os.name != "nt" else [])
    dist = Distribution({"name": "fastrecover", "ext_modules": [ext]})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = str(out / "lib")  # type: ignore[attr-defined]
    cmd.build_temp = str(out / "temp")  # type: ignore[attr-defined]
    try:
        cmd.ensure_finalized()
        cmd.run()
    except Exception as exc:
        raise RuntimeError(
            f"building {_MODULE} from {_SOURCE} failed ({exc}); install a C compiler and the Python headers, "
            f"or set {_PURE_ENV}=1 to install without it (Consumer.poll() then runs in Python, slower)"
        ) from exc
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    built = out / "lib" / "fastrecover" / f"_fastpoll{suffix}"
    if not built.is_file():
        raise RuntimeError(f"building {_MODULE}: no {built.name} in {built.parent}")
    return built
