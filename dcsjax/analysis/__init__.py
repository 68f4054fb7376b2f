"""Analyses across models and runs: scaling curves (paper 002 §3) and the `dcsjax report` figures."""
