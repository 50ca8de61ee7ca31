"""The model as a lossless compressor: range coding driven by its next-token distribution.

    blob = compress(lm, data)        # bytes -> a .bmz container
    data = decompress(lm, blob)      # the exact bytes back, or CompressError

The entropy coder is the `constriction` library's range coder (an optional dependency,
``pip install 'bytemodel[compress]'``, imported only here); the probabilities, the stream layout
and the container are ours.

Stream layout. The file's bytes are tokenized (the checkpoint's tokenizer) into n tokens, cut into
S contiguous streams of n // S or n // S + 1 tokens (the longer ones first). Each stream is coded
as a new document: its context starts with <doc>, and it sees at most `window` tokens of its own
past. The streams advance in lockstep, one token each per step, in lanes of `lane` streams: each
lane is one batched KV cache, and a step is one (lane, 1) forward pass per lane. Two engines
compute the steps (the header names the one used):
  - "cpu" (the CPU's default; bytemodel/compress/cpu_engine.py): a step specialised for (lane, 1) in
    NumPy. By default the window slides (`reread` 0: the cache is a ring of the last `window`
    tokens, default CPU_WINDOW); reread k > 0 instead re-reads the newest k tokens from position
    0 when the cache is full. Lanes run on threads, by default one per core, of at most
    CPU_MAX_LANE streams.
  - "lockstep" (every backend; bytemodel/decode/lockstep.py): the model's own cached forward pass,
    with a sliding window (`reread` 0: the cache becomes a ring once full; the default on a GPU)
    or generation's policy (`reread` window/2: when full, the newest window/2 are re-read; the
    only policy of version 1 files); on a GPU one lane holds every stream.
The streams are also split into `coders`
contiguous groups, each with its own range coder (threads: the coder is the serial part on a
GPU), which takes its streams' symbols in step order, and within a step in stream order; the
payload is the coders' outputs one after the other (their lengths are in the header).

Probabilities. The logits of the tokenizer's byte and merge ids (the <doc> id never occurs inside
a stream, so it is left out) become integer frequencies that sum to 2^24, each at least 1: the
lockstep engine's `quantise` takes the softmax in float64, floor(p * (2^24 - A)) + 1, and adds the
rounding remainder to the likeliest symbol; the cpu engine's cpu_engine.Quantiser does the same
in float32 (the sum and the remainder exact in float64). The coder sees only these integers (as
float32, exact below 2^24).

Determinism. Compressor and decompressor run the very same function (`_drive`): the same engine,
lanes, forward passes and quantisation; only what happens
to the frequencies differs (encode the known token, or decode the next one). Lanes do not share
data, BLAS is held to one thread inside a lane, and threads only decide which lane runs where, so
the thread count does not change a bit. The backend (device, precision, and the numerical
libraries) is written in the header: a file compressed on the CPU decompresses on the CPU and a
GPU file on the GPU (they compute in different precisions, so their logits differ).

Container (.bmz):
    8 bytes   magic b"\\x89BMZ\\r\\n\\x1a\\n"
    2 bytes   container version (little-endian): 4; versions 1-3 still decode (1: no engine in
              the layout, the lockstep engine, re-read window/2; before 3: no view; before 4: the
              header deflated without a dictionary)
    4 bytes   header length H (little-endian)
    H bytes   header: UTF-8 JSON deflated by zlib against a preset dictionary (zdict.py): format,
              checkpoint name + SHA-256 of weights and of tokenizer, reader spec, original length +
              SHA-256, stream layout, coder, backend, payload size
    P bytes   payload: the range coder's 32-bit words, little-endian
    32 bytes  SHA-256 of everything before it (a flipped bit or a cut file is refused up front)
The decompressed bytes are checked against the original's length and SHA-256 before anything is
returned, so a mismatch is an error, never silently wrong output.
"""
from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..decode.lockstep import Lockstep, check_window
from ..decode.window import keep
from ..errors import CompressError, ConfigError, held, poll
from ..ops.host import log_probs
from ..validation import check_workers, whole
from .coder import PREC_BITS, TOTAL, _coder, _coder_version, quantise
from .container import (FORMAT, VERSION, _pack, backend_info, check_layout, check_model, checkpoint_identity,
                        information_limit, read)
from . import pipeline
from .cpu_engine import CpuLockstep, Folded, Quantiser, check_reread, log_softmax_into
from .adapt import Adapt, Adapter, check_gpu, check_start
from .mix3f import mixer as make_mixer
from .view import packed, plan, rebuild
from .layout import (CPU_MAX_LANE, CPU_WINDOW, ENGINES, FRESH_WINDOW, GPU_CODERS, LOCKSTEP_REREAD, adapt_streams,
                     default_lane, default_streams,
                     default_window, groups as _groups, split, starts as _starts)


def _drive(lm, lengths: np.ndarray, window: int, lane: int, decide, workers: int | None = None,
           want_logp: bool = False, progress=None, engine: str = "lockstep", reread: int = 0,
           adapt: Adapt | None = None, known=None) -> None:
    """Advance every stream through the model, one token per stream per step.

    engine "lockstep": lockstep.Lockstep on any backend (`reread` 0 slides, else window/2), frequencies by
    `quantise`; "cpu": cpu_engine.CpuLockstep (NumPy only; `reread` 0 slides the window, k > 0
    re-reads k tokens), frequencies by cpu_engine.Quantiser.

    lengths (S,): tokens per stream (non-increasing). At each step t, decide(t, active, freqs,
    logp) gets the S' = active streams (the first S', those with more than t tokens), their
    frequencies (S', A) (integers, as float32) and, if want_logp, the full model's log-probabilities (S', V)
    float64 (else None), and returns their tokens (S',). Inactive streams are fed token 0.
    adapt: after every segment, one optimizer step on what was coded (compress/adapt.py); the
    model's weights change in place, and every stepper then computes with the new ones.
    known(t, active), when given (compression): the tokens decide(t, ...) will return, so that a
    device stepper can run a step ahead of the coder (compress/pipeline.py).
    On a GPU the sliding lockstep engine without adaptation or log-probabilities runs each step
    as one CUDA graph with the quantiser in it (_device_steppers: the same bits as the launched
    step), the coder overlapped with the next step when known is given; under adaptation the same
    captured step without the quantiser, its logits left on the device for the mixer and its weights
    refreshed in place after each update (_adapt_steppers: the same bits as Lockstep).
    """
    model, tok = lm.model, lm.tokenizer
    S = len(lengths)
    if S == 0:
        return
    A, V = tok.doc_id, tok.vocab_size          # the alphabet: byte and merge ids, not the specials
    xp, ops = model.xp, model.ops
    cpu = ops.cpu_threads                       # lanes may run on CPU threads
    bounds = [(a, min(a + lane, S)) for a in range(0, S, lane)]
    if engine == "lockstep" and reread == 0 and adapt is None and not want_logp:
        devs = _device_steppers(model, bounds, window, int(lengths[0]), A)
        if devs is not None:
            try:
                pipeline.run(devs, bounds, lengths, decide, tok.doc_id, known, progress)
            finally:
                for st in devs:
                    st.close()
            return
    n_workers = max(1, min(len(bounds), workers or _cores())) if cpu else 1
    replicas = [model] + [model.replica() for _ in range(n_workers - 1)]
    weights = model.weights()
    mine = [list(range(w, len(bounds), n_workers)) for w in range(n_workers)]   # lanes of each worker
    steppers, graphed = _lane_steppers(model, replicas, bounds, window, reread, engine, weights,
                                       int(lengths[0]), adapt is not None)
    quants = [Quantiser(b - a, A, TOTAL) for a, b in bounds] if engine == "cpu" else None
    adapter = None
    if adapt is not None:
        adapter = Adapter(model, replicas, bounds, lengths, adapt, tok.doc_id)
    mixer = (make_mixer(adapt.mix, lengths, A, fresh=adapt.start != "checkpoint", xp=xp)
             if adapt is not None and adapt.mix != "none" else None)
    mxp = mixer.xp if mixer is not None else np     # where the mixer computes: the host, or the model's device (ctx3d)
    net = mxp.empty((S, A), dtype=np.float64) if mixer is not None else None   # the network's log-probabilities
    freqs = np.empty((S, A), dtype=np.float32)   # integers below 2^24: exact in float32, as the coder takes them
    logp = np.empty((S, V), dtype=np.float64) if want_logp else None
    feed = np.full(S, tok.doc_id, dtype=np.int64)

    def run_lane(i, w):
        a, b = bounds[i]
        lg = steppers[i].push(feed[a:b])                                       # (lane, V') device
        if mixer is not None and mxp is not np:                                # on the device, float64
            net[a:b] = _log_softmax64(lg[:, :A], mxp)
        elif mixer is not None:                                                # on the host, float64
            net[a:b] = log_probs(ops.to_numpy(lg[:, :A]))
        elif engine == "cpu":
            quants[i](lg, freqs[a:b])
            if want_logp:
                log_softmax_into(lg[:, :V], logp[a:b])
        else:
            freqs[a:b] = ops.to_numpy(quantise(lg, A, xp).astype(xp.float32))
            if want_logp:
                logp[a:b] = log_probs(ops.to_numpy(lg[:, :V]))

    pool = ThreadPoolExecutor(n_workers) if n_workers > 1 else None
    side = _MixerSide(mixer, thread=MIXER_THREAD and mxp is np)   # a device mixer's launches queue behind the lanes'
    limiter = _blas_one_thread() if cpu else None
    start = model.params.copy() if adapter is not None else None    # adaptation leaves the model as it found it
    try:
        if limiter is not None:
            limiter.__enter__()
        steps = int(lengths[0])
        with held():       # a `kill` lands between steps, the lanes' threads idle (errors.py)
            for t in range(steps):
                poll()
                active = int(np.count_nonzero(lengths > t))
                if t == 0:
                    side.begin(active)
                _on_workers(pool, mine, run_lane)
                if mixer is not None:
                    side.wait()
                    _mixed(mixer, t, active, net, freqs, logp, A)
                got = decide(t, active, freqs[:active], None if logp is None else logp[:active])
                feed[:active] = got
                feed[active:] = 0
                if mixer is not None:                  # (the next step's lanes, and any update, run meanwhile)
                    side.learn(t, active, got, int(np.count_nonzero(lengths > t + 1)) if t + 1 < steps else 0)
                if adapter is not None:
                    adapter.record(t, active, got)
                    if adapter.due(t):
                        adapter.update(t, lambda fn: _on_workers(pool, mine, fn))
                        _new_weights(model, steppers, engine, graphed)
                if progress is not None:
                    progress(active)
    finally:
        side.close()
        for st in steppers if graphed else ():
            st.close()
        if start is not None:
            model.params[...] = start
        if limiter is not None:
            limiter.__exit__(None, None, None)
        if pool is not None:
            pool.shutdown()


GPU_GRAPH = True             # the sliding lockstep step as a CUDA graph on a GPU (ops/cuda_decode.LockstepGraph;
                             # the same bytes as the launched step, tests/test_compress_gpu.py; H200, base fp16:
                             # 400 KB 45 -> 241 KB/s compress, 10 MB 305 -> 392: benchmarks/README.md, issue 24)


def _device_steppers(model, bounds, window: int, steps: int, A: int):
    """One ops/cuda_decode.LockstepGraph per lane (its step and the quantiser captured as one CUDA
    graph) where GPU_GRAPH is on and the backend takes it, else None (the launched step)."""
    if not GPU_GRAPH:
        return None
    from ..ops import device_decoder
    dec = device_decoder(model.ops)          # ops/cuda_decode on a GPU, else None
    if dec is None:
        return None
    LockstepGraph, lockstep_graph_ok = dec.LockstepGraph, dec.lockstep_graph_ok
    if lockstep_graph_ok(model, window) is not None:
        return None
    xp, weights = model.xp, model.weights()
    return [LockstepGraph(model, b - a, window, steps, lambda lg: quantise(lg, A, xp), A, weights)
            for a, b in bounds]


def _lane_steppers(model, replicas, bounds, window: int, reread: int, engine: str, weights, steps: int,
                   adapting: bool):
    """Each lane's stepper -> (steppers, graphed): CpuLockstep (engine "cpu") or Lockstep on lane i's
    worker replica, each with room for the `steps` tokens its streams take at most (a cache of
    min(steps, window) slots: memory follows the file, not the window; the same bits); under
    adaptation with a sliding window on a GPU, _adapt_steppers' captured steps where it gives them
    (graphed True)."""
    n = len(replicas)
    if engine == "cpu":
        folded = Folded(model, weights)
        return [CpuLockstep(replicas[i % n], b - a, window, reread, folded, weights, steps=steps)
                for i, (a, b) in enumerate(bounds)], False
    dev = _adapt_steppers(model, bounds, window, steps, weights) if adapting and reread == 0 else None
    if dev is not None:
        return dev, True
    return [Lockstep(replicas[i % n], b - a, window, weights, slide=reread == 0, size=steps)
            for i, (a, b) in enumerate(bounds)], False


def _new_weights(model, steppers, engine: str, graphed: bool) -> None:
    """After an update: every stepper computes with the model's new weights (the cache keeps what
    the old weights computed)."""
    weights = model.weights()
    if engine == "cpu":
        folded = Folded(model, weights)
        for st in steppers:
            st.refold(folded, weights)
    elif graphed:
        for st in steppers:
            st.refresh(weights)         # into the buffers the graph reads
    else:
        for st in steppers:
            st.weights = weights


def _adapt_steppers(model, bounds, window: int, steps: int, weights):
    """Under --adapt: one LockstepGraph per lane whose push is Lockstep.push's, the logits left on
    the device for the mixer (host=False) and the captured weights refreshed after each update,
    where GPU_GRAPH is on and the backend takes it, else None (Lockstep: the same bits)."""
    if not GPU_GRAPH:
        return None
    from ..ops import device_decoder
    dec = device_decoder(model.ops)
    if dec is None or dec.lockstep_graph_ok(model, window) is not None:
        return None
    V = model.cfg.vocab_size
    return [dec.LockstepGraph(model, b - a, window, steps, lambda lg: lg, V, weights, host=False)
            for a, b in bounds]


MIXER_THREAD = True     # the mixer's work beside the lanes' (False: in turn on the calling thread; same bits)


class _MixerSide:
    """The mixer's own work (its update after a step, and the next step's prediction but for the
    network's part) on a thread of its own while the lanes compute that next step (MIXER_THREAD),
    else in turn: the same calls in the same order on the mixer's data, so the same bits."""

    def __init__(self, mixer, thread: bool = True):
        self.mixer, self.pending = mixer, None
        self.pool = ThreadPoolExecutor(1) if mixer is not None and thread else None

    def begin(self, active: int) -> None:
        """Before step 0's lanes: prepare step 0 meanwhile."""
        if self.pool is not None:
            self.pending = self.pool.submit(self.mixer.prepare, 0, active)

    def wait(self) -> None:
        """Before predict: what was started is done (its errors raised here)."""
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    def learn(self, t: int, active: int, got, nxt: int) -> None:
        """After step t: update on its tokens got, then prepare step t + 1 (nxt active streams; 0: none)."""
        if self.pool is None:
            self.mixer.update(t, active, got)
        else:
            self.pending = self.pool.submit(self._step, t, active, np.array(got, copy=True), nxt)

    def _step(self, t: int, active: int, got, nxt: int) -> None:
        self.mixer.update(t, active, got)
        if nxt:
            self.mixer.prepare(t + 1, nxt)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()           # (waits for its last step)


def _mixed(mixer, t: int, active: int, net, freqs, logp, A: int) -> None:
    """Step t's frequencies (and log-probabilities, if asked) from the mix of the network's prediction
    with the file's counts (compress/mix2.py: the mixer the settings name)."""
    z = mixer.predict(t, active, net[:active])
    xp = mixer.xp
    f = mixer.frequencies(z)                                   # (on the mixer's device)
    freqs[:active] = f.astype(np.float32, copy=False).get() if xp is not np else f
    if logp is not None:
        logp[:active, :A] = _log_softmax64(z, xp).get() if xp is not np else log_probs(z)
        logp[:active, A:] = -np.inf


def _log_softmax64(x, xp):
    """x (B, A) device logits -> float64 log-softmax on the device (a device mixer's input)."""
    z = x.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    return z - xp.log(xp.exp(z).sum(axis=1, keepdims=True))


def _on_workers(pool, mine, fn) -> None:
    """fn(lane, worker) for every lane, each worker's lanes in turn on its thread."""
    def work(w):
        for i in mine[w]:
            fn(i, w)
    if pool is None:
        for w in range(len(mine)):
            work(w)
        return
    for f in [pool.submit(work, w) for w in range(len(mine))]:
        f.result()


def _cores() -> int:
    from ..training.runner import cores
    return cores()


def _blas_one_thread():
    """A context that holds BLAS to one thread (results must not depend on BLAS threading)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=1, user_api="blas")


# ---------------------------------------------------------------------------------------------
# the two directions

def _engine_window(device: str, ctx: int, engine: str | None, window: int | None, reread: int | None):
    """The engine, window and re-read policy a compression uses: the device's defaults where not told,
    checked against the model's context -> (engine, window, reread)."""
    engine = ("cpu" if device == "cpu" else "lockstep") if engine is None else engine
    if engine not in ENGINES or (engine == "cpu" and device != "cpu"):
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)} ('cpu' only on the CPU), got {engine!r}")
    W = (min(CPU_WINDOW, ctx) if engine == "cpu" else default_window(ctx, device)) if window is None else int(window)
    check_window(W, ctx)
    if engine == "lockstep":
        rr = (keep(W) if device == "cpu" else LOCKSTEP_REREAD) if reread is None else int(reread)
        if rr not in (0, keep(W)):
            raise ConfigError(f"the lockstep engine slides (re-read 0) or re-reads window/2 = {keep(W)} tokens, "
                              f"not {reread}")
    else:
        rr = 0 if reread is None else int(reread)
        if rr:
            check_reread(rr, W)
    return engine, W, rr


def _check_counts(workers, **counts) -> None:
    """workers in 0..MAX_WORKERS (-1 ran one thread without a word, 2000 made 2000 model replicas);
    the stream layout's counts whole numbers (streams=2.5 was taken as 2)."""
    check_workers(workers)
    for name, v in counts.items():
        if v is not None and not whole(v):
            raise ConfigError(f"{name} must be a whole number, got {v!r}")


def compress(lm, data: bytes, *, streams: int | None = None, window: int | None = None, lane: int | None = None,
             coders: int | None = None, workers: int | None = None, stats: dict | None = None,
             progress=None, engine: str | None = None, reread: int | None = None, reader=None,
             content: bool = False, adapt: Adapt | None = None) -> bytes:
    """data -> a .bmz container (bytes).

    reader (a Reader, a spec string or None): the model codes the reader's view of the file
    (compress/view.py: its documents when it splits the file exactly, else the bytes as they are);
    content: an image's pixels, re-encoded losslessly on decompression (view "content").
    adapt (compress/adapt.py, either engine, any backend): the model learns the file as it codes it
    (one optimizer step after every segment, repeated by the decoder); its settings go in the header.

    streams, window, lane: the stream layout (default: default_streams; the window CPU_WINDOW on
    the cpu engine, else default_window; default_lane; --adapt from a fresh model on the CPU:
    adapt_streams, FRESH_WINDOW, one lane). engine: "cpu" (the default on the CPU:
    cpu_engine.CpuLockstep) or "lockstep" (any backend, the default elsewhere). reread: 0 slides
    the window (the default but for the lockstep engine on the CPU), k > 0 re-reads the newest k
    tokens when the window is full (the lockstep engine: only k = window/2, its default on the
    CPU). coders: independent range
    coders, each taking a contiguous group of streams, run on threads (default: 1 on the CPU, where
    the lanes use the cores, up to GPU_CODERS on the GPU). workers: CPU threads for the lanes.
    stats, if a dict, receives the model's cross-entropy ('model_bits', full vocabulary, float64),
    the ideal size under the quantised frequencies ('quantised_bits') and the payload's size
    ('payload_bits'), the layout blob's size ('layout_bits') and the view ('view': a View)."""
    _check_counts(workers, streams=streams, window=window, reread=reread)
    constriction = _coder()
    raw = bytes(data)
    if isinstance(reader, str):
        from ..readers import get_reader
        reader = get_reader(reader)
    view = plan(raw, reader, content)
    data = view.data
    model, tok = lm.model, lm.tokenizer
    device = model.ops.describe()["device"]
    # a fresh model under --adapt on the CPU: a shorter window and one lane (layout.FRESH_WINDOW)
    fresh = adapt is not None and adapt.start != "checkpoint" and device == "cpu" and engine in (None, "cpu")
    if fresh and window is None and reread is None:
        window = min(FRESH_WINDOW, model.cfg.context)
    engine, W, rr = _engine_window(device, model.cfg.context, engine, window, reread)
    ids = tok.encode(data).astype(np.int64) if data else np.zeros(0, dtype=np.int64)
    n = len(ids)
    S = (default_streams(n, W, device) if adapt is None else adapt_streams(n, device)) if streams is None else int(streams)
    if S < 0 or (n and S < 1):
        raise ConfigError(f"streams must be at least 1, got {S}")
    S = min(S, n)                                  # never an empty stream
    ln = (max(1, min(S, CPU_MAX_LANE)) if fresh else default_lane(S, device, workers or _cores())) if lane is None else int(lane)
    if ln < 1:
        raise ConfigError(f"lane must be at least 1, got {ln}")
    ln = min(ln, max(S, 1))
    check_layout(S, ln)
    C = (1 if device == "cpu" else min(GPU_CODERS, _cores())) if coders is None else int(coders)
    if C < 1:
        raise ConfigError(f"coders must be at least 1, got {C}")
    C = max(1, min(C, S))
    lengths = split(n, S)
    starts = _starts(lengths)
    groups = _groups(S, C)
    family = constriction.stream.model.Categorical(perfect=False)
    encs = [constriction.stream.queue.RangeEncoder() for _ in groups]
    acc = {"model_bits": 0.0, "quantised_bits": 0.0}
    want = stats is not None
    pool = ThreadPoolExecutor(len(groups)) if len(groups) > 1 else None

    def encode(g, active, sym, freqs):
        a, b = groups[g]
        b = min(b, active)
        if b > a:
            encs[g].encode(sym[a:b].astype(np.int32), family, freqs[a:b])

    def decide(t, active, freqs, logp):
        sym = ids[starts[:active] + t]
        _each(pool, len(groups), lambda g: encode(g, active, sym, freqs))
        if want:
            rows = np.arange(active)
            acc["quantised_bits"] += float(-np.log2(freqs[rows, sym] / TOTAL).sum())
            acc["model_bits"] += float(-logp[rows, sym].sum() / np.log(2))
        return sym

    try:
        _drive(lm, lengths, W, ln, decide, workers, want_logp=want, progress=progress, engine=engine, reread=rr,
               adapt=adapt, known=lambda t, active: ids[starts[:active] + t])
    finally:
        if pool is not None:
            pool.shutdown()
    parts = [e.get_compressed().astype("<u4").tobytes() for e in encs] if n else []
    payload = b"".join(parts) + view.blob
    original = raw if view.kind != "content" else data
    if n and view.kind != "content" and len(payload) > len(raw) and os.environ.get("BYTEMODEL_PACK") != "0":
        # the model expanded the file: its bytes packed instead (BYTEMODEL_PACK=0: the model's coding
        # whatever it costs, to measure it; the test suite runs so, tests/conftest.py)
        alt = packed(raw, view.reader, f"the model's coding of {view.describe()} took "
                                       f"{8 * len(payload) / len(raw):.2f} bits a byte")
        if len(alt.blob) < len(payload):
            view, data, parts, payload = alt, b"", [], alt.blob
            S, ln = 0, 1
    layout_tokens = n if view.kind != "packed" else 0
    header = {
        "format": FORMAT, "version": VERSION,
        "checkpoint": checkpoint_identity(lm),
        "reader": view.reader,      # whose view the model codes (the view says which and how)
        "view": {"kind": view.kind, "coder": view.coder, "layout_bytes": len(view.blob), "why": view.why,
                 "format": view.format, "coded": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}},
        "original": {"bytes": len(original), "sha256": hashlib.sha256(original).hexdigest()},
        "layout": {"tokens": layout_tokens, "streams": S, "window": W, "lane": ln, "reread": rr, "engine": engine,
                   "order": "step-major, streams in order"},
        "coder": {"name": "constriction.stream.queue.RangeEncoder", "version": _coder_version(),
                  "model": "Categorical(perfect=False)", "precision_bits": PREC_BITS, "alphabet": tok.doc_id,
                  "group_words": [len(p) // 4 for p in parts]},
        "backend": backend_info(model),
        "adapt": None if adapt is None else adapt.header(),
        "payload_bytes": len(payload),
    }
    if want:
        stats.update(acc, payload_bits=8 * (len(payload) - len(view.blob)), layout_bits=8 * len(view.blob),
                     tokens=n, bytes=len(raw), coded_bytes=len(data), streams=S)
    if stats is not None:
        stats["view"] = view
    return _pack(header, payload)


def _each(pool, n: int, fn) -> None:
    """fn(0..n-1), on the pool's threads when there is one (constriction releases the GIL)."""
    if pool is None:
        for g in range(n):
            fn(g)
        return
    for f in [pool.submit(fn, g) for g in range(n)]:
        f.result()


def decompress(lm, blob: bytes, *, workers: int | None = None, progress=None) -> bytes:
    """A .bmz container -> the original bytes, verified against its length and SHA-256. A packed
    file (the model coded none of it) needs no model: `lm` may then be None and is not used."""
    check_workers(workers)
    header, payload = read(blob)
    if header["view"]["kind"] == "packed":
        return _unpacked(header, payload)
    adapt = None if header.get("adapt") is None else Adapt.from_header(header["adapt"])
    if adapt is not None:
        check_start(header, lm)
    check_model(header, lm)
    if adapt is not None:
        check_gpu(header, lm)
    constriction = _coder()
    lay = header["layout"]
    n, S, W, ln = lay["tokens"], lay["streams"], lay["window"], lay["lane"]
    engine, rr = lay["engine"], lay["reread"]
    if W > lm.model.cfg.context:
        raise CompressError(f"the file's window {W} exceeds the model's context {lm.model.cfg.context}")
    lengths = split(n, S)
    starts = _starts(lengths)
    ids = np.zeros(n, dtype=np.int64)
    counts = header["coder"]["group_words"]
    nw = 4 * sum(counts)
    words = np.frombuffer(payload[:nw], dtype="<u4").astype(np.uint32)
    blob = payload[nw:]
    groups = _groups(S, len(counts)) if n else []
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    decs = [constriction.stream.queue.RangeDecoder(words[offs[g]:offs[g + 1]]) for g in range(len(groups))]
    family = constriction.stream.model.Categorical(perfect=False)
    sym = np.zeros(S, dtype=np.int64)
    info, limit = {"bits": 0.0}, information_limit(header)
    pool = ThreadPoolExecutor(min(len(groups), _cores())) if len(groups) > 1 else None

    def decode(g, active, freqs):
        a, b = groups[g]
        b = min(b, active)
        if b > a:
            sym[a:b] = decs[g].decode(family, freqs[a:b])

    def decide(t, active, freqs, logp):
        try:
            _each(pool, len(groups), lambda g: decode(g, active, freqs))
        except Exception as e:  # the coder refusing its input: the payload does not fit the model
            raise CompressError(f"the payload cannot be decoded with this model ({e})") from None
        ids[starts[:active] + t] = sym[:active]
        # the information decoded so far cannot exceed what the payload holds: a header that claims
        # more tokens than its words can code is refused within a payload's worth of steps
        info["bits"] -= float(np.log2(freqs[np.arange(active), sym[:active]].astype(np.float64) / TOTAL).sum())
        if info["bits"] > limit:
            raise CompressError(f"the payload cannot hold the {n:,} tokens its header claims "
                                f"(decoding step {t} needs more than its {limit:,.0f} bits)")
        return sym[:active]

    try:
        _drive(lm, lengths, W, ln, decide, workers, progress=progress, engine=engine, reread=rr, adapt=adapt)
    finally:
        if pool is not None:
            pool.shutdown()
    data = lm.tokenizer.decode(ids) if n else b""
    view = header["view"]
    coded = view["coded"]
    if len(data) != coded["bytes"] or hashlib.sha256(data).hexdigest() != coded["sha256"]:
        here = backend_info(lm.model)
        diff = {k: (header["backend"].get(k), here.get(k)) for k in set(header["backend"]) | set(here)
                if header["backend"].get(k) != here.get(k)}
        why = ("; it was compressed on another backend: " + ", ".join(f"{k} {a} here {b}" for k, (a, b) in sorted(diff.items()))
               if diff else "")
        raise CompressError(f"decompressed data does not match the original's checksum{why}")
    orig = header["original"]
    if view["kind"] == "split":
        from ..readers import get_reader
        try:
            reader = get_reader(header["reader"])
        except ConfigError as e:
            raise CompressError(f"the file needs the reader {header['reader']!r}: {e}") from None
    else:
        reader = None
    out = rebuild(view, reader, data, blob, orig["bytes"])
    if view["kind"] != "content":   # (content: the pixels exact, not the file's bytes)
        _check_original(out, orig, "layout")
    return out


def _check_original(out: bytes, orig: dict, what: str) -> None:
    """The rebuilt bytes are the original's (its length and SHA-256), else one CompressError."""
    if len(out) != orig["bytes"] or hashlib.sha256(out).hexdigest() != orig["sha256"]:
        raise CompressError(f"the file's {what} does not rebuild the original (the result does not match "
                            f"the original's checksum)")


def _unpacked(header: dict, payload: bytes) -> bytes:
    """A packed file's bytes: its payload (container.read has held the header to no tokens and no
    coder words) unpacked, output refused past the original's length, and checked against the
    original's length and SHA-256; no model."""
    orig = header["original"]
    out = rebuild(header["view"], None, b"", payload, orig["bytes"])
    _check_original(out, orig, "packed data")
    return out
