"""PNG figures, drawn from run files (never from live state): a run's own (run.py), a sweep's
(sweep.py, for ``sam-report``), and what they share (style.py). Matplotlib is imported only
when something is drawn, through its ``Figure`` and the Agg canvas (no pyplot, no display)."""
