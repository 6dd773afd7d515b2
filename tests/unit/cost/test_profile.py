"""Profile format: loading, validation messages (file, line, column), saving."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from schedsim.errors import InputError
from schedsim.cost.profile import (REQUIRED, SCHEMA, Profile, default_profile_path, load_profile,
                              save_profile)

HEADER = "batch,latency_ms_mean,latency_ms_p50,latency_ms_p90,latency_ms_p99,latency_ms_std,n"
GOOD_ROWS = ["1,1.0,0.9,1.2,1.5,0.1,100", "2,1.5,1.4,1.7,2.0,0.1,100", "4,2.5,2.4,2.8,3.1,0.2,100"]


def write(tmp_path, text, name="p.csv", meta=None):
    path = tmp_path / name
    path.write_text(text)
    if meta is not None:
        path.with_suffix(".json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
    return path


def csv_text(*rows, header=HEADER):
    return "\n".join([header, *rows]) + "\n"


def frame():
    return pd.DataFrame({
        "batch": [1, 2, 4], "latency_ms_mean": [1.0, 1.5, 2.5], "latency_ms_p50": [0.9, 1.4, 2.4],
        "latency_ms_p90": [1.2, 1.7, 2.8], "latency_ms_p99": [1.5, 2.0, 3.1],
        "latency_ms_std": [0.1, 0.1, 0.2], "n": [100, 100, 100]})


def test_required_columns_only(tmp_path):
    prof = load_profile(write(tmp_path, csv_text(*GOOD_ROWS)))
    assert prof.batches.tolist() == [1, 2, 4]
    assert prof.seq_lens.tolist() == [0] and not prof.has_seq_len
    assert prof.meta == {} and prof.samples is None
    assert prof.table["latency_ms_mean"].tolist() == [1.0, 1.5, 2.5]
    assert prof.path == tmp_path / "p.csv"


def test_seq_len_grid_sorted_and_extra_columns_kept(tmp_path):
    header = "seq_len,batch,latency_ms_mean,latency_ms_p50,latency_ms_p90,latency_ms_p99,latency_ms_std,n,note"
    rows = ["256,2,4,4,4,4,0,1,x", "128,2,2,2,2,2,0,1,y", "256,1,3,3,3,3,0,1,z", "128,1,1,1,1,1,0,1,w"]
    prof = load_profile(write(tmp_path, csv_text(*rows, header=header)))
    assert prof.has_seq_len
    assert prof.table[["seq_len", "batch"]].values.tolist() == [[128, 1], [128, 2], [256, 1], [256, 2]]
    assert prof.column("latency_ms_mean").tolist() == [[1, 2], [3, 4]]
    assert prof.table["note"].tolist() == ["w", "y", "z", "x"]


@pytest.mark.parametrize("rows, header, expected", [
    # (rows, header or None for the default, regex the message must match)
    (["1,1.0,0.9,1.2,0.1,100"], "batch,latency_ms_mean,latency_ms_p50,latency_ms_p90,latency_ms_std,n",
     r"p\.csv:1: latency_ms_p99: missing required column"),
    (["1,1.0,0.9,1.2,abc,0.1,100"], None, r"p\.csv:2: latency_ms_p99: 'abc' is not a finite number"),
    (GOOD_ROWS[:2] + ["4,2.5,,2.8,3.1,0.2,100"], None, r"p\.csv:4: latency_ms_p50: missing value"),
    (["1,nan,0.9,1.2,1.5,0.1,100"], None, r"p\.csv:2: latency_ms_mean: 'nan' is not a finite number"),
    (["1,inf,0.9,1.2,1.5,0.1,100"], None, r"p\.csv:2: latency_ms_mean: 'inf' is not a finite number"),
    (["1.5,1.0,0.9,1.2,1.5,0.1,100"], None, r"p\.csv:2: batch: 1\.5 is not an integer"),
    (GOOD_ROWS[:1] + ["0,1.0,0.9,1.2,1.5,0.1,100"], None, r"p\.csv:3: batch: 0 must be >= 1"),
    (["1,1.0,0.9,1.2,1.5,0.1,0"], None, r"p\.csv:2: n: 0 must be >= 1"),
    (["1,1.0,-0.9,1.2,1.5,0.1,100"], None, r"p\.csv:2: latency_ms_p50: latency -0\.9 ms must be > 0"),
    (["1,0,0.9,1.2,1.5,0.1,100"], None, r"p\.csv:2: latency_ms_mean: latency 0 ms must be > 0"),
    (["1,1.0,0.9,1.2,1.5,-0.1,100"], None, r"p\.csv:2: latency_ms_std: -0\.1 must be >= 0"),
    (GOOD_ROWS[:1] + ["2,1.5,1.8,1.7,2.0,0.1,100"], None,
     r"p\.csv:3: latency_ms_p90: 1\.7 is below latency_ms_p50 \(1\.8\); percentiles must satisfy"),
    (["1,1.0,0.9,1.6,1.5,0.1,100"], None, r"p\.csv:2: latency_ms_p99: 1\.5 is below latency_ms_p90"),
    (GOOD_ROWS + ["2,1.5,1.4,1.7,2.0,0.1,100"], None,
     r"p\.csv:5: batch: duplicate cell batch=2 \(first at line 3\)"),
    ([], None, r"p\.csv: profile has a header but no rows"),
    (["1,1.0,0.9,1.2,1.5,0.1,100,7"], None, r"p\.csv:2: not a readable CSV row: 8 fields, the header has 7"),
])
def test_bad_table_names_line_and_column(tmp_path, rows, header, expected):
    path = write(tmp_path, csv_text(*rows, header=header or HEADER))
    with pytest.raises(InputError, match=expected):
        load_profile(path)


def test_optional_columns_checked(tmp_path):
    header = HEADER + ",latency_ms_min,latency_ms_max"
    with pytest.raises(InputError, match=r"p\.csv:2: latency_ms_p50: .*minimum cannot exceed the median"):
        load_profile(write(tmp_path, csv_text("1,1.0,0.9,1.2,1.5,0.1,100,0.95,2", header=header)))
    with pytest.raises(InputError, match=r"p\.csv:2: latency_ms_max: 1\.4 is below latency_ms_p99"):
        load_profile(write(tmp_path, csv_text("1,1.0,0.9,1.2,1.5,0.1,100,0.5,1.4", header=header)))


def test_blank_lines_do_not_shift_line_numbers(tmp_path):
    path = write(tmp_path, HEADER + "\n" + GOOD_ROWS[0] + "\n\n" + "2,x,1.4,1.7,2.0,0.1,100\n")
    with pytest.raises(InputError, match=r"p\.csv:4: latency_ms_mean: 'x'"):
        load_profile(path)


def test_incomplete_grid(tmp_path):
    header = "batch,seq_len,latency_ms_mean,latency_ms_p50,latency_ms_p90,latency_ms_p99,latency_ms_std,n"
    path = write(tmp_path, csv_text("1,128,1,1,1,1,0,1", "2,128,2,2,2,2,0,1", "1,256,3,3,3,3,0,1",
                                    header=header))
    with pytest.raises(InputError, match=r"p\.csv: seq_len: incomplete grid: no row for batch=2, seq_len=256"):
        load_profile(path)


def test_duplicate_cell_with_seq_len(tmp_path):
    header = "batch,seq_len,latency_ms_mean,latency_ms_p50,latency_ms_p90,latency_ms_p99,latency_ms_std,n"
    path = write(tmp_path, csv_text("1,128,1,1,1,1,0,1", "1,256,2,2,2,2,0,1", "1,128,3,3,3,3,0,1",
                                    header=header))
    with pytest.raises(InputError, match=r"p\.csv:4: batch: duplicate cell batch=1, seq_len=128 \(first at line 2\)"):
        load_profile(path)


def test_seq_len_must_be_positive(tmp_path):
    header = "batch,seq_len,latency_ms_mean,latency_ms_p50,latency_ms_p90,latency_ms_p99,latency_ms_std,n"
    with pytest.raises(InputError, match=r"p\.csv:2: seq_len: 0 must be >= 1"):
        load_profile(write(tmp_path, csv_text("1,0,1,1,1,1,0,1", header=header)))


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(InputError, match=r"nope\.csv: no such profile"):
        load_profile(tmp_path / "nope.csv")
    with pytest.raises(InputError, match=r"p\.csv:1: empty profile"):
        load_profile(write(tmp_path, ""))
    with pytest.raises(InputError, match=r"p\.csv:1: batch: column appears more than once"):
        load_profile(write(tmp_path, csv_text(header="batch," + HEADER)))
    with pytest.raises(InputError, match=r"p\.csv: cannot read profile"):
        (tmp_path / "p.csv").write_bytes(b"\xff\xfe\x00bad")
        load_profile(tmp_path / "p.csv")


@pytest.mark.parametrize("meta, expected", [
    ('{"model": "x",\n "date": }', r"p\.json:2: invalid JSON"),
    ("[1, 2]", r"p\.json: sidecar must be a JSON object"),
    ({"schema": "schedsim.profile/9"}, r"p\.json: schema: 'schedsim\.profile/9' is not supported"),
    ({"dispatch_overhead_us": -3}, r"p\.json: dispatch_overhead_us: -3 must be a number >= 0"),
    ({"dispatch_overhead_us": "20"}, r"p\.json: dispatch_overhead_us: '20' must be a number"),
    ({"dispatch_overhead_us_per_sample": -0.5}, r"p\.json: dispatch_overhead_us_per_sample: -0\.5 must be a number >= 0"),
    ({"samples": "gone.npz"}, r"p\.json: samples: raw-sample file 'gone\.npz' not found"),
])
def test_bad_sidecar(tmp_path, meta, expected):
    path = write(tmp_path, csv_text(*GOOD_ROWS), meta=meta)
    with pytest.raises(InputError, match=expected):
        load_profile(path)


def test_sidecar_read(tmp_path):
    meta = {"schema": SCHEMA, "model": "bert-base", "dispatch_overhead_us": 12.5}
    prof = load_profile(write(tmp_path, csv_text(*GOOD_ROWS), meta=meta))
    assert prof.meta == meta


def samples_for(batches, seq=0, n=20, seed=0):
    rng = np.random.default_rng(seed)
    return {(b, seq): np.sort(rng.uniform(1.0, 2.0, n) * b) for b in batches}


def test_round_trip_with_samples(tmp_path):
    samples = samples_for([1, 2, 4])
    path = tmp_path / "sub" / "q.csv"
    saved = save_profile(frame(), {"model": "m", "dispatch_overhead_us": 5.0}, path, samples=samples)
    assert sorted(p.name for p in path.parent.iterdir()) == ["q.csv", "q.json", "q.samples.npz"]
    prof = load_profile(path)
    assert prof.meta == {"model": "m", "dispatch_overhead_us": 5.0, "schema": SCHEMA, "samples": "q.samples.npz"}
    pd.testing.assert_frame_equal(prof.table, frame().assign(seq_len=0)[prof.table.columns].astype(prof.table.dtypes))
    for key, arr in samples.items():
        np.testing.assert_array_equal(prof.samples[key], np.sort(arr.astype(np.float32)).astype(np.float64))
    assert prof.samples[(1, 0)].dtype == np.float64
    with np.load(path.with_suffix(".samples.npz")) as z:
        assert z["batch"].dtype == np.int32 and z["seq_len"].dtype == np.int32
        assert z["latency_ms"].dtype == np.float32
    assert saved.table.equals(prof.table)
    # Saving the loaded profile again (meta=None keeps its own) is a fixed point.
    again = save_profile(prof, None, tmp_path / "r.csv")
    assert again.table.equals(prof.table) and again.meta["model"] == "m"
    assert (tmp_path / "r.csv").read_text() == path.read_text()


def test_save_without_samples_drops_stale_reference(tmp_path):
    path = tmp_path / "q.csv"
    save_profile(frame(), {}, path, samples=samples_for([1, 2, 4]))
    save_profile(frame(), {"samples": "q.samples.npz"}, path)
    assert "samples" not in json.loads(path.with_suffix(".json").read_text())
    assert load_profile(path).samples is None
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_samples_without_sidecar_found_by_name(tmp_path):
    path = tmp_path / "q.csv"
    save_profile(frame(), {}, path, samples=samples_for([1, 2, 4]))
    path.with_suffix(".json").unlink()
    assert load_profile(path).samples is not None


def test_samples_must_cover_every_cell(tmp_path):
    path = tmp_path / "q.csv"
    save_profile(frame(), {}, path, samples=samples_for([1, 2, 4]))
    np.savez(path.with_suffix(".samples.npz"), batch=np.array([1, 2], np.int32),
             seq_len=np.array([0, 0], np.int32), latency_ms=np.array([1.0, 2.0], np.float32))
    with pytest.raises(InputError, match=r"q\.samples\.npz: no samples for batch=4, seq_len=0"):
        load_profile(path)
    np.savez(path.with_suffix(".samples.npz"), batch=np.array([1, 2, 4, 8], np.int32),
             seq_len=np.zeros(4, np.int32), latency_ms=np.ones(4, np.float32))
    with pytest.raises(InputError, match=r"samples for batch=8, seq_len=0, a cell the profile table does not have"):
        load_profile(path)
    np.savez(path.with_suffix(".samples.npz"), batch=np.array([1, 2, 4], np.int32),
             seq_len=np.zeros(3, np.int32), latency_ms=np.array([1, np.nan, 1], np.float32))
    with pytest.raises(InputError, match=r"q\.samples\.npz: latency_ms: sample 1 is nan"):
        load_profile(path)
    path.with_suffix(".samples.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match=r"q\.samples\.npz: not a readable \.npz file"):
        load_profile(path)


def test_save_validates_first(tmp_path):
    bad = frame()
    bad.loc[1, "latency_ms_p90"] = 0.5
    with pytest.raises(InputError, match=r"latency_ms_p90: row 1: 0\.5 is below latency_ms_p50"):
        save_profile(bad, {}, tmp_path / "q.csv")
    assert list(tmp_path.iterdir()) == []


def test_from_frame_seq_len_round_trip(tmp_path):
    df = pd.concat([frame().assign(seq_len=s) for s in (128, 512)], ignore_index=True)
    path = tmp_path / "q.csv"
    save_profile(df, {"model": "m"}, path)
    assert path.read_text().splitlines()[0].startswith("batch,seq_len,")
    prof = load_profile(path)
    assert prof.seq_lens.tolist() == [128, 512] and prof.batches.tolist() == [1, 2, 4]


def test_float_values_round_trip_exactly(tmp_path):
    df = frame()
    df["latency_ms_mean"] = [1 / 3, 2 / 3, 1.0 + 1e-12]
    prof = save_profile(df, {}, tmp_path / "q.csv")
    assert prof.table["latency_ms_mean"].tolist() == [1 / 3, 2 / 3, 1.0 + 1e-12]


def test_default_profile_path():
    path = default_profile_path()
    assert path.name == "bert-base-fp16-cg-h200.csv"
    assert path.parent.name == "profiles"
    assert path.parent.parent == Path(__file__).resolve().parents[3]


def test_required_columns_constant():
    assert REQUIRED[0] == "batch" and "n" in REQUIRED
    assert isinstance(Profile.from_frame(frame()), Profile)
    assert re.search("<memory>", Profile.from_frame(frame()).source)


def test_run_does_not_import_pandas():
    # pandas costs about 0.35 s of start-up, and `schedsim run` is benchmarked whole; a
    # subprocess, so that what this test process has imported does not matter.
    root = Path(__file__).resolve().parents[3]
    code = ("import sys, schedsim.cli.main\n"
            "rc = schedsim.cli.main.main(['run', 'traces/poisson_2000rps.csv', '--policy', 'dynamic', '--json'])\n"
            "print('rc', rc, 'pandas' in sys.modules, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "rc 0 False", done.stderr
    assert json.loads(done.stdout)["completed"] > 0
