"""The wheel as a user gets it: built from the repository, installed into a clean virtualenv
without extras (the package and image tests share it, built once per test session)."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "constraints.txt"


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path

    @property
    def metalmend(self) -> Path:
        return self.venv / "bin" / "metalmend"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def pip(python: Path | str, *args: str, cwd: Path) -> None:
    """pip as a user runs it; its output only when it fails (the reason is in it)."""
    result = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=clean_env(),
        check=False,
    )
    if result.returncode:
        raise AssertionError(f"pip {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")


def clean_env() -> dict[str, str]:
    """The environment without this checkout on the import path (no PYTHONPATH, no venv)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def build_wheel(dist: Path) -> Path:
    """``pip wheel .`` with build isolation: the wheel pip would build for ``pip install .``."""
    pip(sys.executable, "wheel", "--no-deps", "--quiet", "-w", str(dist), str(REPO), cwd=dist)
    (wheel,) = dist.glob("metalmend-*.whl")
    return wheel


def install_without_extras(wheel: Path, where: Path) -> Installed:
    """A fresh virtualenv (no system site-packages) with the wheel and its base dependencies
    only, pinned like the repository's own."""
    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    python = where / "bin" / "python"
    pip(python, "install", "--quiet", "-c", str(CONSTRAINTS), str(wheel), cwd=where)
    return Installed(wheel, where)
