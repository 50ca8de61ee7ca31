"""A masked fine-tune on 2 ranks, for tests/test_finetune.py:
`mpiexec -n 2 python tests/mpi_finetune.py PARENT PAIRS OUT`."""
import sys

from bytemodel.training import distributed
from bytemodel.training.finetune import finetune

parent, pairs, out = sys.argv[1:4]
assert distributed.connect("auto").size == 2
finetune(parent, pairs, out, examples="pairs", steps=6, batch_size=5, eval_every=3, eval_tokens=512, warmup=2,
         workers=1)
