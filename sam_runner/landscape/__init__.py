"""``sam-landscape``: the geometry around trained runs and between them.

- slices.py: 1-D and 2-D slices of the loss around one run (filter-normalized random
  directions, or the top Hessian eigenvectors), with the basin width and the curvature at the
  centre;
- connectivity.py: the loss along the straight line between two runs and its barrier;
  bezier.py: a quadratic Bézier curve between them, trained with the run's own optimizer;
- pairs.py: every pair of a sweep's jobs that differ only in seed (resumable);
- what ``sam-report`` reads back is in ``sam_runner/results/landscape.py`` (torch-free).

docs/landscape.md says what is computed, which parts come from which paper, and which are ours.
Importing this package imports nothing heavy.
"""
