"""NVRTC, the compiler CuPy runs gpu/*.cu through, without a GPU and without CuPy: the library of the
`nvidia-cuda-nvrtc-cu12` wheel called through ctypes, with the headers of `nvidia-cuda-runtime-cu12`
(cuda_fp16.h, cuda_bf16.h). Both install on any Linux x86_64 machine (pyproject.toml's test extra);
NVRTC compiles for an architecture it is told, whatever the machine holds.

Which release matters: CUDA 12's, the one the gpu extra's cupy-cuda12x runs. NVRTC 12.9 and 13.0
refuse a generic lambda in device code (the flash_hopper.cu bug of 7920b20) where 13.5 accepts
it, so CUDA 12's wheels are taken before CUDA 13's where both are installed.

    nv = Nvrtc.find()                       # None without the wheels (found through `import nvidia`)
    ok, log = nv.compile(source, "x.cu", ("-std=c++17", "-arch=sm_90"))

ctypes lets go of the GIL during each call, so compiles in threads run in parallel.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

# (library, include directory) inside the `nvidia` namespace package, in the order tried: CUDA 12's
# wheels have a folder per component, CUDA 13's share nvidia/cu13/
LAYOUTS = (("cuda_nvrtc/lib/libnvrtc.so.12", "cuda_runtime/include"),
           ("cu13/lib/libnvrtc.so.13", "cu13/include"))


class Nvrtc:
    """One loaded libnvrtc and the include directory given to every compile (-I)."""

    def __init__(self, library: Path, include: Path):
        self.library, self.include = Path(library), Path(include)
        for builtins in sorted(self.library.parent.glob("libnvrtc-builtins.so.*")):
            ctypes.CDLL(str(builtins))   # loaded first: some releases find it by name alone, not beside libnvrtc
        lib = self._lib = ctypes.CDLL(str(library))
        p, size, char_pp = ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p)
        for name, args in (("nvrtcCreateProgram", [ctypes.POINTER(p), ctypes.c_char_p, ctypes.c_char_p,
                                                   ctypes.c_int, char_pp, char_pp]),
                           ("nvrtcCompileProgram", [p, ctypes.c_int, char_pp]),
                           ("nvrtcGetProgramLogSize", [p, ctypes.POINTER(size)]),
                           ("nvrtcGetProgramLog", [p, ctypes.c_char_p]),
                           ("nvrtcDestroyProgram", [ctypes.POINTER(p)]),
                           ("nvrtcGetPTXSize", [p, ctypes.POINTER(size)]),
                           ("nvrtcGetPTX", [p, ctypes.c_char_p]),
                           ("nvrtcVersion", [ctypes.POINTER(ctypes.c_int)] * 2)):
            getattr(lib, name).argtypes, getattr(lib, name).restype = args, ctypes.c_int
        lib.nvrtcGetErrorString.argtypes, lib.nvrtcGetErrorString.restype = [ctypes.c_int], ctypes.c_char_p

    @classmethod
    def find(cls) -> "Nvrtc | None":
        """The wheels' NVRTC and headers (CUDA 12's first: LAYOUTS), or None where none is installed."""
        try:
            import nvidia
        except ImportError:
            return None
        for base in map(Path, nvidia.__path__):
            for lib, inc in LAYOUTS:
                if (base / lib).is_file() and (base / inc / "cuda_fp16.h").is_file():
                    return cls(base / lib, base / inc)
        return None

    def version(self) -> str:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self._lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)))
        return f"{major.value}.{minor.value}"

    def _check(self, rc: int) -> None:
        if rc:
            raise RuntimeError(f"NVRTC: {self._lib.nvrtcGetErrorString(rc).decode()}")

    def compile(self, source: str, name: str, options, ptx: list | None = None) -> tuple[bool, str]:
        """Compile source (called `name` in the log) with options plus -I of the headers ->
        (whether it compiled, NVRTC's log: the errors, or warnings and ptxas notes). ptx: a list
        the PTX text is appended to when it compiled."""
        lib, prog = self._lib, ctypes.c_void_p()
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None))
        try:
            opts = [f"-I{self.include}".encode()] + [o.encode() for o in options]
            rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            size = ctypes.c_size_t()
            self._check(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)))
            log = ctypes.create_string_buffer(size.value)
            self._check(lib.nvrtcGetProgramLog(prog, log))
            if rc == 0 and ptx is not None:
                self._check(lib.nvrtcGetPTXSize(prog, ctypes.byref(size)))
                text = ctypes.create_string_buffer(size.value)
                self._check(lib.nvrtcGetPTX(prog, text))
                ptx.append(text.value.decode())
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))
        text = log.value.decode(errors="replace")
        return rc == 0, text if rc == 0 else f"{lib.nvrtcGetErrorString(rc).decode()}\n{text}"
