"""The examples in docs/ run here, so the docs cannot drift from the code.

What runs, page by page (each page in its own temporary directory that holds a copy
of docs/examples/, so paths written as from the repository root work unchanged):

- ```console blocks: every ``$ `` line is a command (continuation lines start with
  ``> ``), run in page order: plain ``schedsim ...`` commands through the CLI's entry
  point, in one subprocess per page (imports cost ~1 s a process); anything else by
  bash. It must exit 0 and print every output line the page shows under it, in order
  (``...`` in a line stands for any text; a line of only ``...`` for lines left out), so
  figures quoted from a run cannot drift. Output starting with ``schedsim: error:``
  means it must instead exit 2 and print that line on stderr.
- ```python blocks: run with this interpreter, in the same directory, in page order.
- A block right after ``<!-- not-run -->`` is only shown (installs, downloads).
- A block right after ``<!-- file: PATH -->`` must equal the file PATH, which is
  checked instead of run.

docs/examples/test_my_policy_example.py (the golden-log example of
docs/howto/own-policy.md) is imported and its tests are called.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shown_output import missing_line

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
COMMAND_TIMEOUT_S = 60

_FENCE = re.compile(r"^(?:<!-- (?P<marker>not-run|file: [^ ]+) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)^```$",
                    re.M | re.S)


def blocks(page: str):
    """(lang, marker, body) for each fenced block of ``page``, in order."""
    text = (DOCS / page).read_text(encoding="utf-8")
    return [(m["lang"], m["marker"], m["body"]) for m in _FENCE.finditer(text)]


def console_steps(body: str):
    """(command, first expected output line or None) for each ``$`` command of a block."""
    steps, command, expected = [], None, None
    for line in body.splitlines():
        if line.startswith("$ "):
            if command is not None:
                steps.append((command, expected))
            command, expected = line[2:], None
        elif command is not None and line.startswith("> ") and expected is None:
            command += "\n" + line[2:]
        elif command is not None and expected is None and line.strip():
            expected = line.strip()
    if command is not None:
        steps.append((command, expected))
    return steps


def console_outputs(body: str) -> list[list[str]]:
    """The output lines shown under each ``$`` command of a block (stripped, non-empty), in
    the order of :func:`console_steps`."""
    outs: list[list[str]] = []
    in_command = False
    for line in body.splitlines():
        if line.startswith("$ "):
            outs.append([])
            in_command = True
        elif outs and in_command and line.startswith("> "):
            continue
        elif outs and line.strip():
            in_command = False
            outs[-1].append(line.strip())
    return outs


_missing_line = missing_line


def _shows(expected: str, output: str) -> bool:
    """Whether ``output`` has ``expected`` in it; ``...`` in ``expected`` stands for any text."""
    pattern = ".*?".join(re.escape(part) for part in expected.split("..."))
    return re.search(pattern, output) is not None


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["COLUMNS"] = "80"  # rich wraps tables at the terminal width; fix it as the pages show
    env.pop("PYTHONPATH", None)
    return env


# Runs plain `schedsim ...` commands for one page in one process, through the same entry
# point as the installed script (schedsim.cli.main:main), so imports are paid once per page
# rather than once per command. Protocol: one JSON argv per line in, one JSON result out.
_WORKER = r"""
import contextlib, io, json, sys, traceback
from schedsim.cli.main import main
proto = sys.stdout
for line in sys.stdin:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(json.loads(line))
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            rc = 1
    proto.write(json.dumps({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}) + "\n")
    proto.flush()
"""
_PLAIN = re.compile(r"schedsim(?: [\w./:=,-]+)+")


class _Result:
    def __init__(self, rc, stdout, stderr):
        self.returncode, self.stdout, self.stderr = rc, stdout, stderr


def run_page(page: str, workdir: Path) -> list[str]:
    """Run one page's examples in ``workdir``; return a list of failures (empty = fine)."""
    shutil.copytree(EXAMPLES, workdir / "docs" / "examples")
    env, failures = _env(), []
    worker = subprocess.Popen([sys.executable, "-c", _WORKER], cwd=workdir, env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def run_command(command: str):
        if _PLAIN.fullmatch(command):
            worker.stdin.write(json.dumps(command.split()[1:]) + "\n")
            worker.stdin.flush()
            return _Result(**json.loads(worker.stdout.readline()))
        return subprocess.run(["bash", "-c", "set -eo pipefail\n" + command], cwd=workdir, env=env,
                              text=True, capture_output=True, timeout=COMMAND_TIMEOUT_S)

    try:
        for lang, marker, body in blocks(page):
            if marker == "not-run":
                continue
            if marker and marker.startswith("file: "):
                path = ROOT / marker[len("file: "):]
                if not path.is_file() or path.read_text(encoding="utf-8") != body:
                    failures.append(f"{page}: block marked {marker!r} differs from that file")
                continue
            if lang == "python":
                proc = subprocess.run([sys.executable, "-c", body], cwd=workdir, env=env, text=True,
                                      capture_output=True, timeout=COMMAND_TIMEOUT_S)
                if proc.returncode != 0:
                    failures.append(f"{page}: python block failed:\n{body}\n{proc.stderr[-2000:]}")
                continue
            if lang != "console":
                continue
            for (command, expected), shown in zip(console_steps(body), console_outputs(body)):
                proc = run_command(command)
                wants_error = expected is not None and expected.startswith("schedsim: error:")
                stream = proc.stderr if wants_error else proc.stdout
                if (proc.returncode != 0) != wants_error or (wants_error and proc.returncode != 2):
                    failures.append(f"{page}: `{command}` exited {proc.returncode}:\n{proc.stderr[-2000:]}")
                elif expected is not None and not _shows(expected, stream):
                    failures.append(f"{page}: `{command}` did not print {expected!r}; it printed:\n"
                                    f"{stream[:2000]}")
                elif (missing := _missing_line(shown, stream)) is not None:
                    # Every line a page shows must still be printed (or be marked "..."):
                    # figures quoted from a run must not drift from what the run gives.
                    failures.append(f"{page}: `{command}` no longer prints the shown line {missing!r}; "
                                    f"it printed:\n{stream[:2000]}")
    finally:
        worker.stdin.close()
        worker.wait(timeout=COMMAND_TIMEOUT_S)
    return failures


@pytest.fixture(scope="module")
def page_runs(tmp_path_factory):
    # Pages are independent, so run them side by side.
    pool = ThreadPoolExecutor(max_workers=min(4, len(PAGES)))
    futures = {page: pool.submit(run_page, page, tmp_path_factory.mktemp(page.replace("/", "-")))
               for page in PAGES}
    yield futures
    pool.shutdown(wait=True)


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run(page, page_runs):
    failures = page_runs[page].result()
    assert not failures, "\n\n".join(failures)


def test_pages_have_examples_that_run():
    runnable = [page for page in PAGES
                if any(lang in ("console", "python") and marker is None for lang, marker, _ in blocks(page))]
    for page in ("tutorial.md", "howto/choose-queue-delay.md", "howto/triton-config.md",
                 "howto/own-policy.md", "howto/real-traces.md"):
        assert page in runnable


def test_console_steps_parse_continuations_and_output():
    body = "$ for d in 0 1; do\n>   echo $d\n> done\n0\n1\n$ true\n"
    assert console_steps(body) == [("for d in 0 1; do\n  echo $d\ndone", "0"), ("true", None)]


def _load_example_tests():
    sys.path.insert(0, str(EXAMPLES))  # the example imports its policy as `from my_policy import ...`
    try:
        spec = importlib.util.spec_from_file_location("test_my_policy_example",
                                                      EXAMPLES / "test_my_policy_example.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLES))
    return module


_example = _load_example_tests()
EXAMPLE_TESTS = sorted(name for name in vars(_example) if name.startswith("test_"))


@pytest.mark.parametrize("name", EXAMPLE_TESTS)
def test_own_policy_example(name):
    getattr(_example, name)()


def test_own_policy_example_has_a_golden_log():
    assert "test_golden_decision_log" in EXAMPLE_TESTS


def test_every_shown_output_line_is_checked_in_order():
    body = "$ run\n> --flag\nfirst 1.0\n ...\nthird 3.0\n$ other\n"
    assert console_outputs(body) == [["first 1.0", "...", "third 3.0"], []]
    printed = "first 1.0 \nsecond 2.0\nthird 3.0\n"
    assert _missing_line(["first 1.0", "...", "third 3.0"], printed) is None
    assert _missing_line(["first 1.0", "third 3.1"], printed) == "third 3.1"
    assert _missing_line(["third 3.0", "first 1.0"], printed) == "first 1.0"   # order matters
    assert _missing_line(["first ...", "thi...0"], printed) is None
