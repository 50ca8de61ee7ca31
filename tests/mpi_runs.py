"""Runs for tests/test_distributed.py, started as `mpiexec -n 2 python tests/mpi_runs.py OUT DATA`.

Each rank calls bytemodel.train as a user's script would; the test then compares the checkpoints
with one-process runs of the same settings.
"""
import json
import sys
from pathlib import Path

import bytemodel
from bytemodel.training import distributed

out, data = Path(sys.argv[1]), sys.argv[2]
FAST = json.loads(sys.argv[3])
world = distributed.connect("auto")
assert world.size == 2, f"expected 2 ranks, got {world.size}"

# 1. the same run as one process with the whole batch (4 windows: 2 per rank)
bytemodel.train(data, out / "dp", steps=10, workers=1, **FAST)
# 2. ZeRO-1 on an uneven split (5 windows: 3 + 2), stopped at step 6 by a request that only rank 1
#    sees (as a Ctrl-C reaching one rank): both ranks stop at the same step and rank 0 saves
r = bytemodel.train(data, out / "zero", steps=10, workers=1, shard_optimizer=True,
                    stop_at=6 if world.rank == 1 else None, **{**FAST, "batch_size": 5})
assert r.interrupted and r.step == 6, (world.rank, r.step)
# 3. a run that one process started (stopped at step 4), resumed here on 2 ranks, sharded
bytemodel.train(None, out / "grow", resume=True, shard_optimizer=True)
