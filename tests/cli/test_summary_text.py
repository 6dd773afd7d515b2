"""A run's summary in plain text: rich's borderless table layout without rich, styles only on
a terminal, no line wrapped."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

from cli_helpers import PROFILE, ROOT, TRACE, schedsim

RUN = ["run", str(TRACE), "--profile", str(PROFILE), "--band", "0", "--rate-scale", "0.5", "-q"]


def test_piped_tables_are_padded_and_justified_as_before():
    proc = schedsim(*RUN, "--instances", "3")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "\x1b" not in proc.stdout
    assert lines[0].startswith("dynamic on poisson_2000rps.csv: 20,000 requests, 3 instances, profile ")
    assert lines[0].endswith("linear_profile.csv")  # one line, however long
    table = lines[1:lines.index(next(x for x in lines if x.startswith(" capacity ")))]
    width = len(table[0])
    names = [x[1:].split("  ")[0] for x in table]
    w0 = max(map(len, names))
    # One space of padding either side, two between the columns, names left-justified and
    # values right-justified, the widest cell setting its column's width.
    assert all(len(x) == width and x.startswith(" ") and x.endswith(" ") for x in table)
    assert all(x[1:w0 + 1] == name.ljust(w0) and x[w0 + 1:w0 + 3] == "  " for x, name in zip(table, names))
    values = dict(zip(names, (x[w0 + 3:-1] for x in table)))
    assert values["metric"].lstrip() == "value"
    assert values["instance utilisation"] == values["instance utilisation"].strip()  # the widest
    assert values["completed"] == "20,000".rjust(width - w0 - 4)


def test_llm_tables_right_justify_every_column_but_the_first(tmp_path):
    trace = tmp_path / "tokens.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n"
                     + "".join(f"{i * 0.02:.3f},{100 + 37 * (i % 11)},{5 + 3 * (i % 7)}\n" for i in range(100)))
    proc = schedsim("run", trace, "--policy", "paged-kv", "--profile", ROOT / "tests/data/llm_steps_synthetic.csv",
                    "--band", "0", "-q")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].startswith(" latency (ms) ") and lines[1].endswith("  mean ")
    assert [x.split()[0] for x in lines[2:6]] == ["TTFT", "TPOT", "ITL", "E2E"]
    assert all(len(x) == len(lines[1]) and x.endswith(" ") and x[-2] != " " for x in lines[2:6])
    completed = next(x for x in lines if x.startswith(" completed "))
    assert completed.endswith(" 100 ")


def run_on_terminal(args: list[str], env: dict) -> str:
    """``schedsim ARGS`` with stdout on a pseudo-terminal; what it printed there."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "schedsim.cli.main", *args], cwd=ROOT, env=env,
                            stdout=terminal, stderr=subprocess.DEVNULL)
    os.close(terminal)
    out = bytearray()
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        out += chunk
    os.close(controller)
    assert proc.wait(timeout=300) == 0
    return out.decode()


def test_a_terminal_gets_bold_headers_and_a_yellow_warning_unless_no_color():
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    args = [*RUN[:-3], "--rate-scale", "30", "-q"]  # overloaded: a warning
    shown = run_on_terminal(args, env)
    assert "\x1b[1m metric " in shown and "\x1b[1;33mwarning:\x1b[0m overloaded" in shown
    plain = run_on_terminal(args, dict(env, NO_COLOR="1"))
    assert "\x1b" not in plain and "\nwarning: overloaded" in plain.replace("\r", "")


def test_the_tables_import_no_rich():
    code = ("import sys; from schedsim.cli.main import main; "
            f"rc = main({RUN!r}); "
            "print(rc, sorted({m.split('.')[0] for m in sys.modules} & {'rich'}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip().splitlines()[-1] == "0 []", proc.stdout[-500:] + proc.stderr
