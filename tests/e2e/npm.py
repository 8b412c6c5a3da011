"""Real JavaScript clients for the tests: npm packages installed once per machine, bounded in time."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JS_DIR = Path(__file__).resolve().parent / "js"


def node_project(name: str, packages: list[str], scripts: list[str]) -> Path:
    """A directory with ``packages`` installed and ``scripts`` (from tests/e2e/js) copied in.

    Installed under ``.venv/js/<name>`` (outside git) and reused while the package list is the same.
    """
    if shutil.which("node") is None or shutil.which("npm") is None:
        # Not a skip: the real SDKs working unchanged is part of what the suite proves.
        pytest.fail("node and npm are needed: these tests run the real JavaScript SDKs "
                    "(install Node.js 18+ with npm, e.g. Debian's nodejs and npm packages)")
    project = ROOT / ".venv" / "js" / name
    stamp = project / ".installed"
    wanted = "\n".join(packages)
    if not stamp.exists() or stamp.read_text() != wanted:
        project.mkdir(parents=True, exist_ok=True)
        (project / "package.json").write_text('{"name": "%s", "private": true, "type": "module"}\n' % name)
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", *packages],
                       cwd=project, check=True, timeout=300, capture_output=True)
        stamp.write_text(wanted)
    for script in scripts:
        shutil.copy(JS_DIR / script, project / script)
    return project
