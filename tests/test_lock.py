"""The lock files pin every dependency pyproject.toml names, each with its sha256 hashes, and the
Makefile installs from them in hash-checking mode (`make lock` refreshes them)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _locked(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a pip requirements file with hashes."""
    out: dict[str, tuple[str, list[str]]] = {}
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip() if not line.lstrip().startswith("--hash") else line.strip()
        m = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)\s*(.*)$", line)
        if m:
            out[m.group(1).lower().replace("_", "-")] = (
                m.group(2),
                re.findall(r"--hash=sha256:([0-9a-f]{64})", m.group(3)),
            )
    return out


def test_every_dependency_is_pinned_with_hashes():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = {_name(r) for r in project["dependencies"] + extras["dev"] + extras["scale"] + extras["ray"]}
    locked = _locked(ROOT / "requirements.lock")
    assert len(locked) > 100  # the whole closure, not just the direct dependencies
    missing = sorted(wanted - set(locked) - {"torch"})
    assert not missing, f"not in requirements.lock (run `make lock`): {missing}"
    for name, (version, hashes) in locked.items():
        assert hashes, f"{name}=={version} has no hash"
    assert "torch" not in locked  # installed by itself, the CPU or the CUDA build (Makefile)
    assert not any(n.startswith("nvidia-") or n == "triton" for n in locked), "a CUDA package in the CPU lock"


def test_the_makefile_installs_from_the_locks_in_hash_checking_mode():
    makefile = (ROOT / "Makefile").read_text()
    assert "--require-hashes --no-deps -r requirements.lock" in makefile
    assert "$(PIP) check" in makefile


def test_the_image_copies_every_package_the_project_installs():
    """The Dockerfile's build stage copies each top-level package pyproject.toml installs (a package
    added or renamed without its COPY line would be missing from the image)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    dockerfile = (ROOT / "Dockerfile").read_text()
    missing = sorted(p for p in packages if f"COPY {p}/ {p}/" not in dockerfile)
    assert not missing, f"the Dockerfile does not copy {missing}"
