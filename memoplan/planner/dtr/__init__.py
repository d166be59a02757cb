"""Planner stage, dtr: the ``dtr`` block's threshold for a budget, from the simulation the runtime shares (:mod:`memoplan.runtime.dtr_sim`)."""
