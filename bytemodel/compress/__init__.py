"""The compression wing: the model as a lossless compressor (driver.py: compress / decompress), its
CPU engine (cpu_engine.py) and the model's bits per byte beside the general-purpose compressors
(compress/evaluate.py)."""
from ..errors import CompressError
from .coder import PREC_BITS, TOTAL, quantise
from .container import FORMAT, MAGIC, READS, VERSION, _pack, check_model, read
from .driver import compress, decompress
from .layout import (CPU_MAX_LANE, CPU_MAX_STREAMS, CPU_WINDOW, ENGINES, GPU_CODERS, GPU_MAX_STREAMS, GPU_WINDOW,
                     LOCKSTEP_REREAD, MIN_STREAM, default_lane, default_streams, default_window, split)

# what the wing's front door re-exports (the API, the CLI and the tests take them from here)
__all__ = ["CompressError", "PREC_BITS", "TOTAL", "quantise", "FORMAT", "MAGIC", "READS", "VERSION", "_pack",
           "check_model", "read", "compress", "decompress", "CPU_MAX_LANE", "CPU_MAX_STREAMS", "CPU_WINDOW",
           "ENGINES", "GPU_CODERS", "GPU_MAX_STREAMS", "GPU_WINDOW", "LOCKSTEP_REREAD", "MIN_STREAM",
           "default_lane", "default_streams", "default_window", "split"]
