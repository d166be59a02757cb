"""Planner stage, estimate and measurement: a step's profile, measured or on fake tensors, the device it is planned for and what its peak is made of."""
