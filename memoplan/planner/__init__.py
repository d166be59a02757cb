"""Planner stage: measured profiles in, ordinary plan ASTs out (``memoplan.planner.search``)."""
