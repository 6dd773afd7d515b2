"""The README's commands and figures against what the tool does now.

- The main job (the install line's ``schedsim run``) runs and prints every line the README
  shows under "The main job prints" (``...`` stands for text or lines left out), at 80 columns.
- Every flag of every ``schedsim`` command the README shows is one that command accepts.
- Paths the README passes to --policy exist in a fresh clone.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from shown_output import missing_line

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _schedsim(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="80")
    return subprocess.run([sys.executable, "-m", "schedsim.cli.main", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _commands() -> list[str]:
    """Each ``schedsim ...`` command of the README's bash blocks, continuation lines joined."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split("#", 1)[0]
            for part in line.split("&&"):
                part = part.strip()
                if part.startswith("schedsim "):
                    out.append(part)
    return out


def test_the_main_job_prints_what_the_readme_shows():
    command = next(c for c in _commands() if c.startswith("schedsim run traces/"))
    shown = README.split("The main job\nprints:", 1)[1].split("```\n", 2)[1]
    proc = _schedsim(*shlex.split(command)[1:])
    assert proc.returncode == 0, proc.stderr
    missing = missing_line([line.strip() for line in shown.splitlines() if line.strip()], proc.stdout)
    assert missing is None, f"the README shows {missing!r}; the main job prints:\n{proc.stdout}"


@pytest.mark.parametrize("command", _commands())
def test_every_flag_the_readme_shows_exists(command):
    words = shlex.split(command)
    sub = words[1:3] if words[1] in ("trace", "profile") and not words[2].startswith("-") else words[1:2]
    help_text = _schedsim(*sub, "--help").stdout
    for flag in (w.split("=", 1)[0] for w in words if w.startswith("--")):
        assert re.search(rf"(^|[\s,]){re.escape(flag)}([\s,/]|$)", help_text, re.M), \
            f"README: `{command}`: {flag} is not an option of schedsim {' '.join(sub)}"


def test_policy_paths_in_the_readme_exist():
    for path in re.findall(r"--policy ([\w/.-]+\.py):\w+", README):
        assert (ROOT / path).is_file(), path
