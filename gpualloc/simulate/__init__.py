"""The trace-driven simulator: the live placement and queue logic on simulated time."""
