"""Everything after training: reading run folders, the sweep model and the report.

- rundir.py: ``RunDir``, the one reader of a run folder (config, status, summary, metrics
  lines, eval and landscape results, the model at its last or averaged weights);
- sweep.py: jobs, groups and statistics over one or several sources (sweeps, runs, database);
- sections.py: the registry of report.md's sections; runs_table.py, measures.py,
  corruption.py, eos.py and landscape.py register theirs (an analysis is one module);
- report.py: ``sam-report``; index.py: ``sam-index`` (the SQLite results database).

Importing this package, or any module in it, imports nothing heavy (no torch).
"""
