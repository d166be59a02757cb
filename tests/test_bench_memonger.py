"""benchmarks/memonger.py --quick: it runs, the CNN's outputs are bit for bit, and its measured peak
(CPU meter and profiler, both deterministic) is within 2% of eager's with the default block."""

from __future__ import annotations

import pytest

from benchmarks import memonger

pytestmark = pytest.mark.bench


def test_quick_benchmark_reports_the_cnn_within_two_percent_of_eager(capsys):
    assert memonger.main(["--quick", "--nodes", "60", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    section = out.split("### One inference call", 1)[1].split("###", 1)[0]
    one_call = [line for line in section.splitlines() if line.startswith("| cnn |")]
    assert len(one_call) == 1, out
    cells = [c.strip() for c in one_call[0].strip("|").split("|")]
    assert cells[2] == "yes"  # bit for bit
    assert float(cells[6]) <= 1.02  # arena / eager, CPU meter
    assert float(cells[7]) <= 1.02  # arena / eager, profiler (kernel workspaces too)
    eager_allocs, arena_allocs = (int(part.split()[0]) for part in cells[8].split("→"))
    assert arena_allocs < eager_allocs
    assert "### Planning a 60-step synthetic graph" in out
