"""Raw run data kept in git history rather than in the working tree.

experiments/RUNS.md lists every raw run folder and file that left the tree, with the
commit that holds it. A script that reads one calls :func:`require` first, so a missing
run ends in one line naming RUNS.md and the command that restores it, not a traceback.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "experiments" / "RUNS.md"
ROW = re.compile(r"^\| `(experiments/[^`]+?)/?` \| `([0-9a-f]{7,40})` \|")


def manifest() -> dict[str, str]:
    """{path relative to the repository: the commit that holds it} from RUNS.md."""
    if not MANIFEST.exists():
        return {}
    return {m[1]: m[2] for line in MANIFEST.read_text().splitlines() if (m := ROW.match(line))}


def restore_command(path: Path) -> str | None:
    """``git checkout COMMIT -- PATH`` for a path inside (or above) a listed raw run, else None."""
    try:
        rel = Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    entries = manifest()
    stem = Path(rel).with_suffix("")   # a profile's table and its .json sidecar go together
    hits = [p for p in entries if rel == p or rel.startswith(p + "/") or p.startswith(rel + "/")
            or Path(p).with_suffix("") == stem]
    if not hits:
        return None
    return " && ".join(f"git checkout {entries[p]} -- {p}" for p in sorted(hits))


def _present(path: Path) -> bool:
    # The committed live runs keep their step logs gzipped; readers accept either.
    return path.exists() or path.with_name(path.name + ".gz").exists()


def require(*paths) -> None:
    """Exit (status 2, one line on stderr) unless every path exists."""
    for path in map(Path, paths):
        if _present(path):
            continue
        cmd = restore_command(path)
        if cmd:
            print(f"{path}: raw run data kept out of the working tree (experiments/RUNS.md); restore it with: {cmd}",
                  file=sys.stderr)
        else:
            print(f"{path}: no such file or folder", file=sys.stderr)
        raise SystemExit(2)
