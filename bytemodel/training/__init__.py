"""The training wing, read top-down: prepare.py sets a run up (settings resolved, then frozen, as a
Run), loop.py trains it (Loop.run; LoopState holds what the run decides), runner.py splits each
batch over MPI ranks (distributed.py, the world) and CPU threads, zero.py shards AdamW over the
ranks, optim.py holds AdamW and its schedule, progress.py draws the bar; the loop's helpers: the
time budget (budget.py), what a run fills in for itself (autoconf.py), training-only data
(augment.py) and the bookkeeping of best, patience and over-fitting (watch.py)."""
