"""Performance measurement: deterministic workloads, runners and reports."""
