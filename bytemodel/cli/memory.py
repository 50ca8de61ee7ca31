"""glibc's malloc for the command's process: freed memory kept for reuse.

By default glibc hands every large temporary (from 128 KB, rising with use) back to the kernel
when it is freed, and the next one of the same size is faulted in again, page by page, zeroed.
A training step, a scoring batch or a compression step makes many such temporaries: at tiny on
the 2-core VM, `score`'s forward ran at ~36,000 tokens/s that way against ~46,000 with the memory
kept, training ~3% faster (benchmarks/README.md, "Freed memory kept for every command"); --adapt
faulted ~300,000 pages in per 100 KB against ~35,000 ("Freed memory kept"). main() sets it for
every command. ROOMY_MMAP and ROOMY_TRIM are set together, since either alone turns off glibc's own
adjustment of both and is worse. Not a bit of any output depends on it.
"""
from __future__ import annotations

ROOMY_MMAP = 32 << 20        # allocations below 32 MB (glibc's largest) come from the heap, not mmap
ROOMY_TRIM = 256 << 20       # the heap gives memory back only when 256 MB lie free at its top


def roomy_malloc() -> bool:
    """Set ROOMY_MMAP and ROOMY_TRIM where the C library is glibc (else nothing); True if set.
    The running C library says what it is (confstr), at every command's start-up, without reading
    the interpreter's binary as platform.libc_ver does."""
    import ctypes
    import os
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return False
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(mallopt(M_MMAP_THRESHOLD, ROOMY_MMAP)) and bool(mallopt(M_TRIM_THRESHOLD, ROOMY_TRIM))
