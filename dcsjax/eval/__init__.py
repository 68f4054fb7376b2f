"""Evaluation: protocols (APS, QA-PPL, MCQA-LL, APX, DCS) over benchmark items, run resumably into the results
layout, and the tables that show them.

`run` (`dcsjax eval`: plan, resume, score, summarise), `results` (fingerprints, the locked writer, the
atomic summary, readers that never write), `protocols/` (one module each, one registry), `tables`.
"""
