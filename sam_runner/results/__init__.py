"""Everything after training: the sweep model and the report (a run folder itself is read
through ``sam_runner.rundir.RunDir``, its model rebuilt by ``sam_runner.rebuild``).

- sweep.py: jobs, groups and statistics over one or several sources (sweeps, runs, database);
- sections.py: the registry of report.md's sections; runs_table.py, measure_ranking.py,
  joint.py, corruption.py, eos.py, jsd.py, quantization.py, landscape.py and barriers.py
  register theirs (an
  analysis is one module);
- report.py: ``sam-report``; index.py: ``sam-index`` (the SQLite results database).

Importing this package, or any module in it, imports nothing heavy (no torch).
"""
