"""Report stage: ``memoplan report`` and the benchmark plots.

* :mod:`memoplan.report.data` -- the data behind each plot: pure functions, no torch, no drawing;
* :mod:`memoplan.report.collect` -- the measurements (timelines, saved bytes, the budget sweep);
* :mod:`memoplan.report.peers` -- torch.compile with ``activation_memory_budget``, metered;
* :mod:`memoplan.report.draw` -- matplotlib figures as inline SVG;
* :mod:`memoplan.report.page` -- the self-contained HTML page;
* :mod:`memoplan.report.command` -- the command: measure, draw, then write.
"""
