"""Writing the experiments' result tables: one CSV per command, figures to 6 significant digits."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def write_csv(df: pd.DataFrame, out: Path | None) -> None:
    """Write ``df`` to ``out`` (nothing when None) and say so."""
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out, index=False, float_format="%.6g")
    print(f"wrote {out}")
