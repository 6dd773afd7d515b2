"""The sweep's p99 plot draws each cell's prediction band where the sweep computed one."""

from types import SimpleNamespace

import matplotlib.pyplot as plt

from schedsim.planning import sweep_plots


def test_the_p99_plot_draws_the_bands_it_has(tmp_path, monkeypatch):
    drawn = []
    real = plt.Axes.vlines

    def spy(self, x, lo, hi, **kw):
        drawn.append((list(x), list(lo), list(hi)))
        return real(self, x, lo, hi, **kw)

    monkeypatch.setattr(plt.Axes, "vlines", spy)
    rows = [{"cell": i, "d": str(d), "p99_ms": p, "throughput_rps": 100.0, "meets_slo": ok,
             **({"p99_ms_lo": p - 0.5, "p99_ms_hi": p + 0.5} if ok else {})}
            for i, (d, p, ok) in enumerate([(0, 3.0, True), (500, 4.0, True), (1000, 9.0, False)])]
    spec = SimpleNamespace(grid={"d": [0, 500, 1000]}, slo=[])
    written = sweep_plots.write_sweep_plots(tmp_path, rows, spec, front=[0, 1])
    assert {p.name for p in written} == {"vs_d.png", "pareto.png"}
    assert drawn == [([0.0, 500.0], [2.5, 3.5], [3.5, 4.5])]   # the third cell has no band
