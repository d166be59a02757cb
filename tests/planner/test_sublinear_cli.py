"""`memoplan plan --planner sublinear` takes the `sublinear` block's five settings, and they reach
the search: the header says what ran and what the genetic refinement gained."""

from __future__ import annotations

import pytest

import memoplan
from memoplan.cli import main
from memoplan.planner.plan import sublinear_summary
from memoplan.planner.search import Estimate, GeneticReport
from memoplan.syntax.blocks import SublinearConfig

TRANSFORMER = ["--model", "memoplan.examples.transformer:build", "--example", "randint(4, 32, high=100)"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))


def _plan(tmp_path, transformer_profile, name: str, *knobs: str) -> str:
    out = tmp_path / name
    args = ["plan", *TRANSFORMER, "--profile", transformer_profile, "--budget", "60%", "--planner", "sublinear", *knobs]
    assert main([*args, "-o", str(out)]) == 0
    return out.read_text()


@pytest.mark.slow
def test_the_settings_reach_the_search_and_the_header_says_what_the_genetic_search_did(tmp_path, transformer_profile):
    text = _plan(
        tmp_path,
        transformer_profile,
        "a.memplan",
        "--thresh-nr-try",
        "3",
        "--genetic-nr-iter",
        "4",
        "--genetic-pool-size",
        "5",
        "--lb-memory",
        "64 KiB",
        "--num-worker",
        "1",
    )
    (line,) = [line_ for line_ in text.splitlines() if line_.startswith("# planner:")]
    assert (
        "sublinear (thresh_nr_try 3, genetic_nr_iter 4, genetic_pool_size 5, lb_memory 65536 B, num_worker 1)" in line
    )
    assert "the genetic refinement" in line and "candidates evaluated" in line
    plain = _plan(tmp_path, transformer_profile, "b.memplan", "--num-worker", "1")
    (line,) = [line_ for line_ in plain.splitlines() if line_.startswith("# planner:")]
    assert "genetic_nr_iter 0" in line and "no genetic refinement" in line


@pytest.mark.slow
def test_one_and_two_workers_write_the_same_plan(tmp_path, transformer_profile):
    knobs = ("--genetic-nr-iter", "3", "--genetic-pool-size", "4")
    one = _plan(tmp_path, transformer_profile, "one.memplan", *knobs, "--num-worker", "1")
    two = _plan(tmp_path, transformer_profile, "two.memplan", *knobs, "--num-worker", "2")
    assert one.replace("num_worker 1", "num_worker 2") == two
    memoplan.parse(one)


def test_settings_without_the_sublinear_planner_or_out_of_range_are_refused(tmp_path, capsys):
    out = tmp_path / "p.memplan"
    assert main(["plan", *TRANSFORMER, "--budget", "60%", "--genetic-nr-iter", "3", "-o", str(out)]) == 2
    assert "--genetic-nr-iter set the sublinear search: add --planner sublinear" in capsys.readouterr().err
    args = ["plan", *TRANSFORMER, "--budget", "60%", "--planner", "sublinear", "--genetic-pool-size", "1"]
    assert main([*args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "<command line>:2:13: error[MP203]: `genetic_pool_size` must be >= 2" in err and "^^^" in err
    assert not out.exists()
    assert main([*args[:-2], "--genetic-nr-iter", "3; thresh_nr_try = 5", "-o", str(out)]) == 1
    assert "error[MP202]: `--genetic-nr-iter 3; thresh_nr_try = 5` is not one value" in capsys.readouterr().err


def _report(bytes_saved: int, seconds_saved: float, improved: bool, generations: int = 5) -> GeneticReport:
    est = Estimate(100, 1.0)
    return GeneticReport((1,), 1, (), est, est, improved, seconds_saved, bytes_saved, generations, 42)


def test_the_summary_says_more_or_less_and_when_nothing_was_gained():
    config = SublinearConfig(num_worker=1)
    assert "peak 512 B less, recompute 2.000 ms more" in sublinear_summary(config, _report(512, -0.002, True))
    assert "peak 128 B more, recompute 1.500 ms less" in sublinear_summary(config, _report(-128, 0.0015, True))
    assert "gained nothing over the best threshold (42 candidates" in sublinear_summary(config, _report(0, 0.0, False))
    assert "no genetic refinement" in sublinear_summary(config, _report(0, 0.0, False, generations=0))


@pytest.mark.slow
def test_megengine_environment_variables_are_the_blocks_defaults(tmp_path, transformer_profile, monkeypatch, capsys):
    """MGB_SUBLINEAR_MEMORY_* are read as the sublinear search's defaults, said on stderr; options win."""
    monkeypatch.setenv("MGB_SUBLINEAR_MEMORY_GENETIC_NR_ITER", "2")
    monkeypatch.setenv("MGB_SUBLINEAR_MEMORY_LOWER_BOUND_MB", "1")
    monkeypatch.setenv("MGB_SUBLINEAR_MEMORY_THRESH_NR_TRY", "4")
    text = _plan(tmp_path, transformer_profile, "env.memplan", "--thresh-nr-try", "3", "--num-worker", "1")
    (line,) = [line_ for line_ in text.splitlines() if line_.startswith("# planner:")]
    assert "thresh_nr_try 3, genetic_nr_iter 2, genetic_pool_size 20, lb_memory 1048576 B" in line
    err = capsys.readouterr().err
    assert "MGB_SUBLINEAR_MEMORY_GENETIC_NR_ITER read as the sublinear search's default genetic_nr_iter = 2" in err
    assert "MGB_SUBLINEAR_MEMORY_LOWER_BOUND_MB read as the sublinear search's default lb_memory = 1 MiB" in err


@pytest.mark.slow
def test_megengine_environment_variables_are_never_ignored(tmp_path, transformer_profile, monkeypatch, capsys):
    out = tmp_path / "p.memplan"
    args = ["plan", *TRANSFORMER, "--profile", transformer_profile, "--budget", "60%"]
    monkeypatch.setenv("MGB_SUBLINEAR_MEMORY_GENETIC_NR_ITER", "2")
    assert main([*args, "-o", str(out)]) == 0  # another planner: a note says they were not used
    assert "MGB_SUBLINEAR_MEMORY_GENETIC_NR_ITER not used: the sublinear search reads it" in capsys.readouterr().err
    monkeypatch.setenv("MGB_SUBLINEAR_MEMORY_GENETIC_NR_ITER", "-1")
    assert main([*args, "--planner", "sublinear", "-o", str(out)]) == 1
    assert "error[MP203]: `genetic_nr_iter` must be >= 0" in capsys.readouterr().err
    monkeypatch.delenv("MGB_SUBLINEAR_MEMORY_GENETIC_NR_ITER")
    monkeypatch.setenv("MGB_SUBLINEAR_MEMORY_GENETIC_NR_ITR", "2")
    assert main([*args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "error[MP201]: unknown environment variable `MGB_SUBLINEAR_MEMORY_GENETIC_NR_ITR`" in err
    assert "did you mean `MGB_SUBLINEAR_MEMORY_GENETIC_NR_ITER`" in err
