"""The training wing: the loop (loop.py), AdamW and its schedule (training/optim.py), the runner that splits a
batch over threads (runner.py) and MPI ranks (training/distributed.py), and the loop's helpers: the time budget
(training/budget.py), what a run fills in for itself (training/autoconf.py), training-only data (training/augment.py) and the
bookkeeping of best, patience and over-fitting (training/watch.py)."""
