#!/bin/bash
# One call of a lent GPU machine that checks and measures the whole GPU side (each step under its
# own timeout, about 9 minutes in all; logs and JSON under $OUT). Run from the repository root:
#     bash benchmarks/device_check.sh            # everything
#     bash benchmarks/device_check.sh suite      # only the GPU tests
#     bash benchmarks/device_check.sh pdl        # the decoder's tests, then batch 1, 4 with PDL on / off and
#                                                # 16, 64 with the cuBLAS step as it is / its cache from views /
#                                                # and each add fused with its RMSNorm
#     bash benchmarks/device_check.sh fused      # the captured cuBLAS step with fewer launches (the default): its tests,
#                                                # generation at 16 / 64 and the compressor, fused against unfused
#     bash benchmarks/device_check.sh sample     # the shipped sample, 5 min, four at once: the issue's defaults, today's,
#                                                # and two stronger dropouts (issue 27's -0.02)
#     bash benchmarks/device_check.sh hopper     # issue 28: the Hopper module compiled, the flash tests, the kernels
#                                                # against SDPA (with the study variants), training against torch.compile
#     bash benchmarks/device_check.sh dq         # issue 28: the dQ studies at D = 64 (h_staged, h_pipe), then the flash
#                                                # tests on each of VARIANTS (default h_pipe_v4's kernel) as if shipped (with
#                                                # attention dropout's tests where the variant has its _drop twin); at D = 128
#                                                # (h_v4 there): SHAPES="16,12,1024,128 16,12,4096,128" VARIANTS=flash_bwd_h128_m32
#     bash benchmarks/device_check.sh bwd64      # issue 28: the shipped backward at D = 64 timed beside its studies (h_staged,
#                                                # h_pipe) and SDPA at three shapes, then the flash, attention dropout and ordering tests
#     bash benchmarks/device_check.sh split      # issue 28: the backward's dQ studies of the thirtieth session (BWD_VERSIONS:
#                                                # h_split*, the dQ product split by columns) timed beside
#                                                # the shipped backward and SDPA at D = 64 and 128, then the flash tests on
#                                                # each of VARIANTS as if shipped (comma: one kernel a head dim)
#     bash benchmarks/device_check.sh graph      # issue 28: small and base training with the step captured as one CUDA graph
#                                                # (gpu_train.py --graph: the launches it saves) beside the launched step and torch.compile
#     bash benchmarks/device_check.sh score      # issue 24: score's tail on the GPU (tests/test_score.py, score.py --whole-forward)
#     bash benchmarks/device_check.sh eval       # issue 24: eval's compressors beside the model (12 MB of shared libraries,
#                                                # base): eval, score and the compressors alone, timed; GPU tests first
#     bash benchmarks/device_check.sh tma        # issue 28: the TMA-fed forwards (flash_fwd_w): tests, then against the
#                                                # shipped wgmma forward and SDPA (SHAPES)
#     bash benchmarks/device_check.sh tmaship    # issue 28: the shipped TMA forward's final tree: every GPU test on its paths,
#                                                # its timing
#     bash benchmarks/device_check.sh tmaship2   # then attention dropout and a base step's dropout cost with the TMA
#                                                # twins off / on (BYTEMODEL_FWD_TMA_DROP), and score at base
#     bash benchmarks/device_check.sh stepkernels  # issue 28: every kernel of a small and a base training step, ours
#                                                # and torch.compile's, from PyTorch's profiler (gpu_train.py --kernels)
#     bash benchmarks/device_check.sh gen        # issue 24: generation's byte mask on the device's sampler (the decoder's
#                                                # tests, then base with a DNA mask against the host loop), then spec
#     bash benchmarks/device_check.sh spec       # issue 24: generate --speculative against the on-device decoder, batch 1,
#                                                # base and small with four heads (a few steps: speed only), fp16 and fp32
#     bash benchmarks/device_check.sh ncu        # issue 28: Nsight Compute on the backward (NCU_BWD: shipped h_staged h_nodq h_pipe)
#                                                # and the forward at NCU_SHAPE (32,12,1024,64); flash_attn.py --profile
#     bash benchmarks/device_check.sh attn       # the attention kernels (Hopper tiles, ping-pong) against SDPA
#     bash benchmarks/device_check.sh kernels    # every kernel benchmark of benchmarks/kernels/ but attention's, base, fp16 and bf16
#     bash benchmarks/device_check.sh attnpay    # issue 27: half of linux-docs at base, the defaults and --dropout-attn 0
#                                                # at once for MIN (6) minutes: does attention dropout pay for its cost?
#     bash benchmarks/device_check.sh text       # linux-docs, 6 minutes alone, FLAGS (default: dropout 0.2 / attention
#                                                # 0.2, 1.1568 in the tenth session), the run's held-out tail (issue 27's 1.15)
#     bash benchmarks/device_check.sh split      # the four-genome split (.dev/ksplit from benchmarks/klebsiella_split.py),
#                                                # MINUTES (5) each, two at once: A (the issue's defaults) and B (today's),
#                                                # heldout.fa scored; RUNS=1 or 2 runs one alone; SRC and HELD another
#                                                # source and held-out file (HELD=none: validation only), e.g. one genome:
#                                                # mkdir -p .dev/genome && cp "$(bytemodel data get klebsiella)"/Klebs_HS11286.fna.xz .dev/genome/
#     bash benchmarks/device_check.sh little     # photos (rows, tile 16, 32) and speech (pcm16), 4 minutes each,
#                                                # at once, scored on held-out files (benchmarks/little_data.py;
#                                                # needs .dev/little/ made here by its split and codecs steps)
#     bash benchmarks/device_check.sh photos     # photos alone with the default reader (tile 32), 4 minutes, scored
#     bash benchmarks/device_check.sh speech     # speech (ENC: pcm16, or pcm16msb), 5 minutes, the defaults and FLAGS
#                                                # (default: dropout 0.3 / attention 0.1) at once, both held-out clips scored
#                                                # (and with --adapt under the FLAGS run)
#     bash benchmarks/device_check.sh adapt      # --adapt from a fresh small model (issue 26's 200 KB/s): the GPU tests of
#                                                # the path, the scatter kernel's benchmark, then FILE (default .dev/t1m.txt)
#                                                # compressed at fp32 / fp16 / bf16 through the CLI, each decompressed and
#                                                # compared, sizes and times
# The compressor's tests need constriction (and zstandard, soundfile), which the device's Python
# may lack: carry them as wheels in .whl/ (the device tool's README says how); they are installed
# into /tmp/site when present. Each mode ran on the H200 (benchmarks/README.md; the adapt mode in the fourteenth
# session: its tests cut off at 150 s there, now 300 s in parallel; run apart, 24 passed), except the sample, text, split and
# speech modes as written: the runs they repeat did (ninth and tenth sessions), by other scripts.
set -u
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=$PWD:/tmp/site
else
    export PYTHONPATH=$PWD
fi
only=${1:-all}
T0=$(date +%s)
step() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }
nvidia-smi -L
python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"

if [ "$only" = pdl ]; then
    step "PDL tests"
    timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 150 -m gpu tests/test_decode_gpu.py -rfE > "$OUT/pdl_tests.log" 2>&1
    echo "pdl tests rc=$?"; tail -3 "$OUT/pdl_tests.log"
    step "generation, PDL off / on, cuBLAS step / tensor-core kernels"
    timeout 360 python3 benchmarks/generate.py --device cuda --presets base --samples 1,4,16,64 --tokens 512 --pdl --views --rounds 3 \
        > "$OUT/generate_pdl.log" 2>&1; cat "$OUT/generate_pdl.log"
    exit 0
fi
if [ "$only" = fused ]; then    # the captured cuBLAS step with fewer launches (STEP_VIEWS, STEP_ADD_NORM): tests, then timed
    step "tests of the captured step (none / views / views+add_norm against forward_cached's bytes)"
    timeout 100 python3 -m pytest -q -p no:cacheprovider --timeout 90 -m gpu tests/test_decode_gpu.py \
        -k "blas_graph or fp16_same_seed" -rfE > "$OUT/fused_tests.log" 2>&1
    echo "decode tests rc=$?"; tail -3 "$OUT/fused_tests.log"
    BYTEMODEL_STEP_FUSED=0 timeout 100 python3 -m pytest -q -p no:cacheprovider --timeout 90 -m gpu tests/test_compress_gpu.py \
        -rfE > "$OUT/fused_compress_tests.log" 2>&1     # the compressor's captured step, unfused (the default is fused), against its launched one
    echo "compressor tests, unfused, rc=$?"; tail -3 "$OUT/fused_compress_tests.log"
    step "generation at 16 and 64: fused (the default) / as it was / views only"
    timeout 200 python3 benchmarks/generate.py --device cuda --presets base --samples 16,64 --tokens 512 --views --rounds 3 \
        > "$OUT/generate_fused.log" 2>&1; cat "$OUT/generate_fused.log"
    step "the compressor at base, 400 kB, unfused (BYTEMODEL_STEP_FUSED=0) / fused (the default)"
    for f in 0 1; do
        BYTEMODEL_STEP_FUSED=$f timeout 60 python3 benchmarks/compress.py --preset base --device cuda --precision fp16 \
            --train-steps 0 --bytes 400000 --quick > "$OUT/compress_fused$f.log" 2>&1; tail -3 "$OUT/compress_fused$f.log"
    done
    exit 0
fi
if [ "$only" = sample ]; then   # issue 27's -0.02 on the shipped sample: four variants screened side by side (equal shares)
    step "the shipped sample, 5 minutes, four at once: the issue's defaults, today's, dropout 0.3 / 0.2, base with 0.3 / 0.2"
    S=datasets/klebsiella_hs11286_1m.fa.gz
    i=0
    for extra in "--schedule cosine --dropout 0 --dropout-attn 0 --reader fasta:revcomp=no" "" \
                 "--dropout 0.3 --dropout-attn 0.2" "--preset base --dropout 0.3 --dropout-attn 0.2"; do
        i=$((i + 1))
        python3 -m bytemodel.cli train --source $S --device cuda --minutes 5 $extra --no-baseline --out /tmp/sample_$i \
            > "$OUT/sample_$i.log" 2>&1 &
    done
    wait; for j in 1 2 3 4; do echo "== sample_$j"; head -1 "$OUT/sample_$j.log"; grep -E "best:|stopped|finished" "$OUT/sample_$j.log"; done
    exit 0
fi
if [ "$only" = hopper ]; then   # issue 28 in one call: the Hopper module compiled, the flash tests, the kernels, training
    step "flash_hopper.cu and its study variants compiled by the device's NVRTC (the tests would only see a fallback)"
    python3 -c "
from bytemodel.ops import cuda_ops as c
v = open('benchmarks/kernels/flash_hopper_variants.cu').read()
for p in ('fp16', 'bf16'):
    for extra in ('', v):
        c._hopper_module(p, extra); print(p, 'with variants' if extra else 'shipped', 'compiled')
" 2>&1 | tail -12
    step "the flash tests and the flash ordering tests"
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_flash_attention.py tests/test_gpu_determinism.py \
        -k flash -rfE > "$OUT/hopper_tests.log" 2>&1
    echo "rc=$?"; tail -3 "$OUT/hopper_tests.log"
    step "attention kernels against SDPA (h_staged, h_pipe: the dQ adds in other forms, checked for the shipped bytes)"
    timeout 300 python3 benchmarks/kernels/flash_attn.py --json "$OUT/flash_attn.json" > "$OUT/flash_attn.log" 2>&1
    echo "rc=$?"; grep -E "versions|^ *\(" "$OUT/flash_attn.log"
    step "training at base against torch.compile"
    timeout 240 python3 benchmarks/gpu_train.py --presets base --bf16 base --steps 10 --json "$OUT/train.json" 2>&1 \
        | grep -E "tok/s|peak"
    exit 0
fi
if [ "$only" = dq ]; then   # issue 28: the backward's dQ studies at D = 64, then the GPU tests on each of VARIANTS as if shipped
    VARIANTS=${VARIANTS:-flash_bwd_h64_m160}   # h_pipe_v4 (h_pipe: flash_bwd_h64_m128, passed; h_v4 ships)
    step "the backward's dQ studies (each checked for the shipped kernel's bytes)"
    timeout 150 python3 benchmarks/kernels/flash_attn.py --shipped-forward --no-torch --shapes ${SHAPES:-32,12,1024,64 16,12,4096,64} \
        --json "$OUT/flash_attn_dq.json" > "$OUT/flash_attn_dq.log" 2>&1
    echo "rc=$?"; grep -E "versions|^ *\(|FAIL|repeat" "$OUT/flash_attn_dq.log"
    for V in $VARIANTS; do
        step "the flash tests and the flash ordering tests on $V (tests/conftest.py's BYTEMODEL_TEST_HOPPER_BWD)"
        BYTEMODEL_TEST_HOPPER_BWD=$V timeout ${TEST_S:-200} python3 -m pytest -q -p no:cacheprovider tests/test_flash_attention.py \
            tests/test_gpu_determinism.py tests/test_cuda_attn_dropout.py -k "flash or backward or attn" -rfE > "$OUT/dq_tests_$V.log" 2>&1
        echo "rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/dq_tests_$V.log" | head -5; tail -1 "$OUT/dq_tests_$V.log"
    done
    exit 0
fi
if [ "$only" = bwd64 ]; then   # issue 28: the shipped backward at D = 64 timed beside its studies, then its tests
    step "the backward at D = 64: shipped against h_staged, h_pipe and the other studies (bytes checked), and SDPA"
    timeout ${STUDY_S:-220} python3 benchmarks/kernels/flash_attn.py --shipped-forward --shapes 16,12,1024,64 16,12,4096,64 \
        32,12,1024,64 --json "$OUT/flash_attn_bwd64.json" > "$OUT/flash_attn_bwd64.log" 2>&1
    echo "rc=$?"; grep -E "versions|^ *\(|FAIL|repeat" "$OUT/flash_attn_bwd64.log"
    step "the flash, attention dropout and ordering tests on the shipped kernels"
    n=""; python3 -c "import xdist" 2>/dev/null && n="-n 4"
    timeout ${TEST_S:-240} python3 -m pytest -q -p no:cacheprovider $n tests/test_flash_attention.py tests/test_cuda_attn_dropout.py \
        tests/test_gpu_determinism.py -rfE > "$OUT/bwd64_tests.log" 2>&1
    echo "rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/bwd64_tests.log" | head -5; tail -1 "$OUT/bwd64_tests.log"
    exit 0
fi
if [ "$only" = split ]; then   # issue 28: the backward's studies (MODE bits 8, 9) against the shipped backward
    step "the dQ studies beside the shipped backward and SDPA (each checked against the shipped kernel)"
    timeout ${STUDY_S:-260} python3 benchmarks/kernels/flash_attn.py --shipped-forward \
        --bwd-versions ${BWD_VERSIONS:-h_staged,h_split,h_split_v4,h_nodq,h_immediate} \
        --shapes ${SHAPES:-16,12,1024,64 16,12,4096,64 32,12,1024,64 16,12,1024,128 16,12,4096,128} \
        --json "$OUT/flash_attn_split.json" > "$OUT/flash_attn_split.log" 2>&1
    echo "rc=$?"; grep -E "versions|repeat|^ *\(|FAIL|rror" "$OUT/flash_attn_split.log"
    n=""; python3 -c "import xdist" 2>/dev/null && n="-n 4"
    for V in ${VARIANTS:-flash_bwd_h64_m288,flash_bwd_h128_m288}; do
        step "the flash, attention dropout and ordering tests on $V as if shipped"
        BYTEMODEL_TEST_HOPPER_BWD=$V timeout ${TEST_S:-150} python3 -m pytest -q -p no:cacheprovider $n tests/test_flash_attention.py \
            tests/test_gpu_determinism.py tests/test_cuda_attn_dropout.py -k "flash or backward or attn or drop" -rfE \
            > "$OUT/split_tests_${V//,/+}.log" 2>&1
        echo "rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/split_tests_${V//,/+}.log" | head -5; tail -1 "$OUT/split_tests_${V//,/+}.log"
    done
    exit 0
fi
if [ "$only" = graph ]; then   # issue 28: the whole training step as one CUDA graph (gpu_train.py --graph) against the launched step
    step "training, the launched step and the captured one, against torch.compile"
    timeout ${TRAIN_S:-400} python3 benchmarks/gpu_train.py --presets small base --bf16 base --steps 10 --graph \
        --json "$OUT/gpu_train_graph.json" > "$OUT/gpu_train_graph.log" 2>&1
    echo "rc=$?"; grep -E "tok/s|peak|failed|rror" "$OUT/gpu_train_graph.log"
    exit 0
fi
if [ "$only" = score ]; then   # score's tail on the GPU (ops/scorer.TAIL): its tests, then base with and without it
    step "score's tests, then base with and without the tail"
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_score.py -rfE > "$OUT/score_tests.log" 2>&1
    echo "rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/score_tests.log" | head -5; tail -1 "$OUT/score_tests.log"
    timeout 150 python3 benchmarks/score.py --device cuda --preset base --mb 8 --reference-mb 0.02 --whole-forward \
        --rounds 3 2>&1 | tail -6
    exit 0
fi
if [ "$only" = eval ]; then   # issue 24: `eval` with the compressors on threads beside the model's scoring
    n=""; python3 -c "import xdist" 2>/dev/null && n="-n 12"
    step "the decoder's, the compressor's and score's GPU tests"
    timeout ${TEST_S:-150} python3 -m pytest -q -p no:cacheprovider $n -m gpu tests/test_decode_gpu.py tests/test_compress_gpu.py \
        tests/test_score.py -rfE > "$OUT/eval_tests.log" 2>&1
    echo "rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/eval_tests.log" | head -5; tail -1 "$OUT/eval_tests.log"
    python3 -c "
import glob, os
fs = sorted((f for f in glob.glob('/usr/lib/x86_64-linux-gnu/*.so*') if not os.path.islink(f)), key=os.path.getsize, reverse=True)
out = b''.join(open(f, 'rb').read() for f in fs[:40])[:12_000_000]
open('/tmp/libs.bin', 'wb').write(out); print('libs.bin', len(out), 'bytes of shared libraries')"
    step "a base model (3 steps: the speed does not depend on the weights), then eval / score / the compressors alone"
    timeout 120 python3 -m bytemodel.cli train --source /tmp/libs.bin --preset base --steps 3 --device cuda --no-baseline -q \
        --out /tmp/evalrun > "$OUT/eval_train.log" 2>&1; echo "rc=$?"
    for c in "score /tmp/libs.bin -c /tmp/evalrun --device cuda" "eval /tmp/libs.bin -c /tmp/evalrun --device cuda" \
             "score /tmp/libs.bin -c /tmp/evalrun --device cuda" "eval /tmp/libs.bin -c /tmp/evalrun --device cuda"; do
        t0=$(date +%s.%N); timeout 120 python3 -m bytemodel.cli $c > /tmp/eval_out.txt 2>&1; rc=$?
        echo "$c: rc=$rc $(awk "BEGIN{print $(date +%s.%N) - $t0}") s"; tail -2 /tmp/eval_out.txt
    done
    python3 -c "
import time
from bytemodel.compress import evaluate as ev
d = open('/tmp/libs.bin', 'rb').read()
t = time.perf_counter(); ev.compressed_sizes(d); print(f'the four compressors one after another (eval before): {time.perf_counter() - t:.2f} s')"
    exit 0
fi
if [ "$only" = tma ]; then   # issue 28: the TMA-fed forwards (flash_fwd_w): their tests, then timed beside the shipped one
    step "the TMA forward's tests"
    timeout ${TEST_S:-240} python3 -m pytest -q -p no:cacheprovider --maxfail=6 tests/test_flash_tma.py -rfE > "$OUT/tma_tests.log" 2>&1
    echo "rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/tma_tests.log" | head -10; tail -1 "$OUT/tma_tests.log"
    step "forward TFLOP/s: the TMA kernels, the shipped wgmma forward, SDPA"
    timeout 240 python3 benchmarks/kernels/flash_attn.py --tma --shapes ${SHAPES:-16,12,1024,64 16,12,1024,128 16,12,4096,64 16,12,4096,128 32,12,1024,64} \
        --json "$OUT/tma.json" > "$OUT/tma_bench.log" 2>&1
    echo "rc=$?"; tail -8 "$OUT/tma_bench.log"
    exit 0
fi
if [ "$only" = tmaship ]; then   # issue 28: what the thirty-fifth session shipped without a GPU left to run it on
    n=""; python3 -c "import xdist" 2>/dev/null && n="-n 12"
    step "the TMA forward's tests (its dropout twins' too), then the flash, dropout and ordering suites"
    timeout 200 python3 -m pytest -q -p no:cacheprovider $n tests/test_flash_tma.py tests/test_flash_attention.py \
        tests/test_gpu_determinism.py tests/test_cuda_attn_dropout.py tests/test_cuda_ops.py -rfE > "$OUT/tmaship_flash.log" 2>&1
    echo "rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/tmaship_flash.log" | head -10; tail -1 "$OUT/tmaship_flash.log"
    step "the paths that call the forward for prefill and windows: decode, compress, score, adapt"
    timeout 220 python3 -m pytest -q -p no:cacheprovider $n -m gpu tests/test_decode_gpu.py tests/test_compress_gpu.py \
        tests/test_score.py tests/test_adapt_gpu.py -rfE > "$OUT/tmaship_paths.log" 2>&1
    echo "rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/tmaship_paths.log" | head -10; tail -1 "$OUT/tmaship_paths.log"
    step "forward TFLOP/s (the wgmma and TMA kernels, SDPA)"
    timeout 90 python3 benchmarks/kernels/flash_attn.py --tma --no-torch --shapes 16,12,1024,64 16,12,1024,128 32,12,1024,64 2>&1 | tail -3
    exit 0
fi
if [ "$only" = tmaship2 ]; then   # the second half of tmaship: dropout's costs with the TMA twins off / on, scoring
    step "attention dropout with the TMA twins off / on"
    for d in 0 1; do
        BYTEMODEL_FWD_TMA_DROP=$d timeout 60 python3 benchmarks/kernels/attn_dropout.py --presets base --precision bf16 2>&1 | tail -2 | sed "s/^/[TMA_DROP=$d] /"
    done
    step "what dropout costs a base training step (issue 27's 3%), the TMA dropout twins off / on"
    for d in 0 1; do
        BYTEMODEL_FWD_TMA_DROP=$d timeout 150 python3 benchmarks/kernels/dropout.py --precision bf16 --steps 8 2>&1 | tail -7 | sed "s/^/[TMA_DROP=$d] /"
    done
    step "score at base with the TMA forward (issue 24)"
    timeout 120 python3 benchmarks/score.py --device cuda --preset base --mb 8 --reference-mb 0.02 --rounds 3 2>&1 | tail -6
    exit 0
fi
if [ "$only" = stepkernels ]; then   # issue 28: every kernel of a training step, ours and torch.compile's
    step "kernels of a step, small and base, fp16 (PyTorch's profiler over both)"
    timeout ${KERNELS_S:-400} python3 benchmarks/gpu_train.py --presets ${PRESETS:-small base} --kernels > "$OUT/stepkernels.log" 2>&1
    echo "rc=$?"; cat "$OUT/stepkernels.log" | grep -v "^W\|warn" | head -150
    exit 0
fi
if [ "$only" = gen ]; then    # issue 24: the byte mask on the device's sampler: its tests, then timed; then the spec mode
    n=""; python3 -c "import xdist" 2>/dev/null && n="-n 8"
    step "the decoder's tests (tests/test_decode_gpu.py: the masked sampler and generation among them)"
    timeout ${TEST_S:-240} python3 -m pytest -q -p no:cacheprovider $n tests/test_decode_gpu.py -rfE > "$OUT/gen_tests.log" 2>&1
    echo "rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/gen_tests.log" | head -5; tail -1 "$OUT/gen_tests.log"
    step "base, a DNA byte mask: the device's sampler against the host loop (where the mask sent generation before)"
    timeout 200 python3 benchmarks/generate.py --device cuda --presets base --samples 1,64 --tokens 512 --mask \
        --only ours,host > "$OUT/gen_mask.log" 2>&1
    echo "rc=$?"; tail -7 "$OUT/gen_mask.log"
    only=spec
fi
if [ "$only" = spec ]; then   # issue 24: generate --speculative on the GPU against the on-device decoder, batch 1
    python3 -c "import gzip; d = gzip.open('datasets/klebsiella_hs11286_1m.fa.gz').read(); open('/tmp/held.fa', 'wb').write(b'>held\\n' + d[-60000:])"
    for P in ${SPEC_PRESETS:-base small}; do   # the speed does not depend on the weights: a few steps make a run
        step "a $P model with four heads, ${SPEC_STEPS:-40} steps on the shipped sample"
        timeout 200 python3 -m bytemodel.cli train --source datasets/klebsiella_hs11286_1m.fa.gz --preset $P --mtp 4 \
            --steps ${SPEC_STEPS:-40} --device cuda --out /tmp/spec_$P --no-baseline -q > "$OUT/spec_train_$P.log" 2>&1
        echo "rc=$?"; tail -2 "$OUT/spec_train_$P.log"
    done
    for PR in fp16 fp32; do
        step "plain against speculative, $PR (SPEC_RUNS: more run folders, e.g. carried ones)"
        timeout ${SPEC_S:-150} python3 benchmarks/speculative.py /tmp/spec_* ${SPEC_RUNS:-} --heldout /tmp/held.fa --device cuda \
            --precision $PR --bytes 1024 --rounds 3 --json "$OUT/spec_$PR.json" > "$OUT/spec_$PR.log" 2>&1
        echo "rc=$?"; cat "$OUT/spec_$PR.log" | tail -6
    done
    step "the CLI as users run it: generate 4096 bytes from the base DNA run, fp16 (the run's byte mask / --any-byte / --speculative)"
    for F in "" "--any-byte" "--speculative"; do
        t0=$(date +%s.%N)
        timeout 120 python3 -m bytemodel.cli generate -c /tmp/spec_base --device cuda --precision fp16 --bytes 4096 --seed 1 $F \
            > "$OUT/cli_gen.out" 2> "$OUT/cli_gen.err"
        echo "rc=$? generate $F: $(python3 -c "print(f'{$(date +%s.%N) - $t0:.2f}')") s wall, $(wc -c < "$OUT/cli_gen.out") bytes, \
$(tr -d 'ACGT\n' < "$OUT/cli_gen.out" | wc -c) outside ACGT; $(tail -1 "$OUT/cli_gen.err")"
    done
    exit 0
fi
if [ "$only" = ncu ]; then   # issue 28: Nsight Compute on the backward's versions and the forward, one kernel each
    shape=${NCU_SHAPE:-32,12,1024,64}
    secs="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats"
    mets="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__pipe_tensor.*pct_of_peak_sustained_active,regex:sm__inst_executed_pipe_(xu|fma|fmaheavy|alu|lsu|uniform)\.avg\.pct_of_peak_sustained_active"
    : > "$OUT/ncu.err"
    for V in ${NCU_BWD:-shipped h_staged h_nodq h_pipe} fwd; do   # one kernel each, the first after the checks
        step "ncu: $V at $shape"
        filt=flash_bwd_h; [ "$V" = fwd ] && filt=flash_fwd_w   # the shipped forward (TMA)
        for raw in 1 0; do   # again without the raw metrics, should a name not exist on this ncu
            m=(); [ $raw = 1 ] && m=(--metrics "$mets")
            timeout 150 ncu --clock-control none -k "regex:$filt" --launch-skip 2 --launch-count 1 $secs "${m[@]}" --csv \
                --page details python3 benchmarks/kernels/flash_attn.py --shapes "$shape" --profile "$V" \
                > "$OUT/ncu_$V.csv" 2>> "$OUT/ncu.err" && break
        done
        echo "$V rc=$?"
    done
    tail -4 "$OUT/ncu.err"
    python3 benchmarks/kernels/ncu_summary.py "$OUT"/ncu_*.csv
    exit 0
fi
if [ "$only" = kernels ]; then  # one line per kernel of gpu/ (benchmarks/kernels/<op>.py), base shapes, fp16 and bf16
    for f in embedding rmsnorm rope swiglu residual cross_entropy optim score decode_attn; do
        for p in fp16 bf16; do
            step "kernels/$f.py $p"
            timeout 60 python3 benchmarks/kernels/$f.py --presets base --precision $p --json "$OUT/kernel_${f}_$p.json" \
                > "$OUT/kernel_${f}_$p.log" 2>&1
            echo "rc=$?"; tail -n 4 "$OUT/kernel_${f}_$p.log"
        done
    done
    step "what dropout costs: its kernels and a base step with and without (issue 27's 3%)"
    timeout 150 python3 benchmarks/kernels/dropout.py --precision bf16 --steps 10 --json "$OUT/kernel_dropout.json" \
        > "$OUT/kernel_dropout.log" 2>&1; echo "rc=$?"; tail -n 8 "$OUT/kernel_dropout.log"
    timeout 90 python3 benchmarks/kernels/attn_dropout.py --presets base --precision bf16 > "$OUT/kernel_attn_dropout.log" 2>&1
    echo "rc=$?"; tail -n 6 "$OUT/kernel_attn_dropout.log"
    timeout 90 python3 benchmarks/kernels/attn_dropout_hash.py --precision bf16 > "$OUT/kernel_attn_dropout_hash.log" 2>&1
    echo "rc=$?"; tail -n 6 "$OUT/kernel_attn_dropout_hash.log"   # Hopper only: what the hash's rounds cost
    exit 0
fi
if [ "$only" = attn ]; then     # every forward tile (the ping-pong ones too) checked against the shipped kernel, then timed
    step "attention kernels against SDPA"
    timeout 420 python3 benchmarks/kernels/flash_attn.py --json "$OUT/flash_attn.json" > "$OUT/flash_attn.log" 2>&1
    echo "rc=$?"; tail -n 30 "$OUT/flash_attn.log"
    exit 0
fi
if [ "$only" = attnpay ]; then   # does attention dropout pay for its step cost at base, at equal wall time?
    # needs .dev/data/ld-half: python benchmarks/tree_head.py "$(bytemodel data get linux-docs)" .dev/data/ld-half
    # (11.9 MB of English: ~10 passes each in MIN minutes shared); two runs at once on one GPU, so each has
    # the same share of it: the defaults (dropout auto: 0.2 / 0.2 from the plan) and the same with --dropout-attn 0
    MIN=${MIN:-6}; S=.dev/data/ld-half
    step "warm-up (the kernels compiled before the timed runs)"
    timeout 90 python3 -m bytemodel.cli train --source $S --reader text --device cuda --preset base --steps 20 --eval-every 10 \
        --eval-tokens 65536 --no-baseline --out /tmp/attnpay_warm > "$OUT/attnpay_warm.log" 2>&1; echo "rc=$?"
    step "two runs at once, $MIN minutes, base: the defaults / --dropout-attn 0"
    i=0
    for extra in "" "--dropout-attn 0"; do
        i=$((i + 1))
        python3 -m bytemodel.cli train --source $S --reader text --device cuda --preset base --minutes $MIN $extra \
            --no-baseline --out /tmp/attnpay_$i > "$OUT/attnpay_$i.log" 2>&1 &
    done
    wait; for j in 1 2; do echo "== attnpay_$j"; grep -E "dropout|best:|stopped|finished|time budget" "$OUT/attnpay_$j.log" | head -12
        cp /tmp/attnpay_$j/metrics.jsonl "$OUT/attnpay_$j.metrics.jsonl" 2>/dev/null; done
    exit 0
fi
if [ "$only" = text ]; then     # needs .dev/data/linux-docs (a copy of `bytemodel data get linux-docs`' folder)
    FLAGS=${FLAGS:---dropout 0.2 --dropout-attn 0.2}
    step "linux-docs, 6 minutes alone: $FLAGS"
    python3 -m bytemodel.cli train --source .dev/data/linux-docs --reader text --device cuda --minutes 6 \
        $FLAGS --no-baseline --out /tmp/text > "$OUT/text.log" 2>&1
    grep -E "best:|stopped|finished|time budget" "$OUT/text.log"; tail -c 300000 /tmp/text/metrics.jsonl > "$OUT/text.metrics.jsonl"
    exit 0
fi
if [ "$only" = split ]; then   # needs .dev/ksplit (benchmarks/klebsiella_split.py DATA .dev/ksplit)
    # A and B: two runs' extra flags ("" is the defaults as they are); MINUTES each, both at once on one GPU
    # RUNS: which of them run ("1 2", both at once; "1" or "2" alone has the GPU to itself: 5 GPU-minutes as the issue asks)
    A=${A---schedule cosine --dropout 0 --dropout-attn 0 --reader fasta:revcomp=no}; B=${B-}; MINUTES=${MINUTES:-5}
    RUNS=${RUNS:-1 2}
    step "four-genome split, $MINUTES minutes, runs [$RUNS] at once: 1 [$A], 2 [$B]"
    # SRC, HELD: another source and held-out file (default the split's; HELD=none scores nothing)
    SRC=${SRC:-.dev/ksplit/train}; HELD=${HELD:-.dev/ksplit/heldout.fa}; i=0
    # first a short run on the same data, so that every timed run finds the GPU kernels compiled: on a fresh
    # machine the first run's first step compiles them (~13 s of a 3.5-minute budget on an H100, twenty-first
    # session), and a run after it does not; WARM=0 skips it
    [ "${WARM:-1}" = 0 ] || python3 -m bytemodel.cli train --source $SRC --device cuda --steps 20 --eval-every 10 \
        --eval-tokens 65536 --no-baseline --out /tmp/split_warm > "$OUT/split_warm.log" 2>&1
    for extra in "$A" "$B"; do
        i=$((i + 1))
        case " $RUNS " in *" $i "*) ;; *) continue ;; esac
        ( python3 -m bytemodel.cli train --source $SRC --device cuda --minutes $MINUTES $extra --no-baseline \
              --out /tmp/split_$i > "$OUT/split_$i.log" 2>&1
          [ "$HELD" = none ] || python3 -m bytemodel.cli score $HELD -c /tmp/split_$i --device cuda > "$OUT/split_$i.held" 2>&1 ) &
    done
    wait; for j in $RUNS; do echo "== split_$j"; head -1 "$OUT/split_$j.log"
        grep -E "best:|stopped|finished|dropout auto|time budget|reverse strand" "$OUT/split_$j.log"
        cat "$OUT/split_$j.held" 2>/dev/null; cp /tmp/split_$j/metrics.jsonl "$OUT/split_$j.metrics.jsonl" 2>/dev/null; done
    exit 0
fi
if [ "$only" = speech ]; then   # needs .dev/little (benchmarks/little_data.py split and codecs)
    FLAGS=${FLAGS:---dropout 0.3 --dropout-attn 0.1}
    ENC=${ENC:-pcm16}       # or pcm16msb: the high byte first
    step "speech $ENC, 5 minutes, two at once: the defaults and $FLAGS"
    L=.dev/little
    for i in 1 2; do
        extra=""; [ $i = 2 ] && extra=$FLAGS
        python3 -m bytemodel.cli train --source $L/speech/train --reader audio:encoding=$ENC,rate=8000 --device cuda \
            --minutes 5 $extra --no-baseline --out /tmp/speech_$i > "$OUT/speech_$i.log" 2>&1 &
    done
    wait
    for i in 1 2; do for h in $L/speech/held/*.wav; do
        python3 -m bytemodel.cli score $h -c /tmp/speech_$i --device cuda > "$OUT/speech_${i}_$(basename $h).score" 2>&1 &
    done; done
    wait
    for h in $L/speech/held/*.wav; do   # the FLAGS run adapting to each clip as it codes (compress --adapt's bits)
        timeout 90 python3 -m bytemodel.cli score $h -c /tmp/speech_2 --device cuda --adapt > "$OUT/speech_2_$(basename $h).adapt" 2>&1
    done
    grep -h "best:\|stopped\|finished" "$OUT"/speech_*.log; cat "$OUT"/speech_*.score "$OUT"/speech_*.adapt
    python3 benchmarks/little_data.py table .dev/little 2>/dev/null | tail -5   # FLAC's side
    exit 0
fi
if [ "$only" = adapt ]; then    # FILE: e.g. linux-docs' files in `sort -df` order, the first 1,000,000 bytes
    FILE=${FILE:-.dev/t1m.txt}
    step "the GPU tests of --adapt (fresh models at each precision, ctx3d against NumPy)"
    XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n 6"   # (one at a time they took over 150 s)
    timeout 300 python3 -m pytest -q -p no:cacheprovider $XD -m gpu tests/test_adapt_gpu.py tests/test_mix_gpu.py \
        tests/test_compress_gpu.py -rfE > "$OUT/adapt_tests.log" 2>&1
    echo "adapt tests rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/adapt_tests.log" | head; tail -3 "$OUT/adapt_tests.log"
    step "the ordered scatter-add against cupyx.scatter_add (benchmarks/kernels/scatter.py)"
    timeout 60 python3 benchmarks/kernels/scatter.py --json "$OUT/scatter.json" > "$OUT/scatter.log" 2>&1
    echo "scatter rc=$?"; cat "$OUT/scatter.log"
    step "where the time goes (benchmarks/adapt_profile.py, fp16, 256 KB of FILE, graph on and off)"
    timeout 150 python3 benchmarks/adapt_profile.py "$FILE" --device cuda --precision fp16 --bytes 262144 \
        --streams 1024,4096 --graph both --json "$OUT/adapt_profile.json" > "$OUT/adapt_profile.log" 2>&1
    echo "profile rc=$?"; cat "$OUT/adapt_profile.log"
    ls -l "$FILE"; sha256sum "$FILE"
    for p in ${PRECISIONS:-fp32 fp16 bf16}; do   # PRECISIONS: a subset, e.g. "fp16 bf16"
        step "compress --adapt --preset small at $p"
        t=$(date +%s.%N)
        timeout 100 python3 -m bytemodel.cli compress "$FILE" --adapt --preset small --device cuda --precision $p \
            -o /tmp/adapt_$p.bmz -f > "$OUT/adapt_$p.log" 2>&1
        echo "compress $p rc=$? $(awk "BEGIN{print $(date +%s.%N) - $t}") s $(stat -c%s /tmp/adapt_$p.bmz 2>/dev/null) bytes"
        t=$(date +%s.%N)
        timeout 90 python3 -m bytemodel.cli decompress /tmp/adapt_$p.bmz -o /tmp/adapt_$p.out -f >> "$OUT/adapt_$p.log" 2>&1
        echo "decompress $p rc=$? $(awk "BEGIN{print $(date +%s.%N) - $t}") s"; cmp -s /tmp/adapt_$p.out "$FILE" && echo "$p RT_OK"
    done
    exit 0
fi
if [ "$only" = little ] || [ "$only" = photos ]; then
    step "$only"
    case $only in
        little) args="--minutes 4 --tiles 0,16,32 --parallel" ;;
        photos) args="--minutes 4 --tiles 32 --kinds photos --parallel" ;;
    esac
    timeout 560 python3 benchmarks/little_data.py model .dev/little --device cuda $args > "$OUT/little_$only.log" 2>&1
    echo "rc=$?"; tail -4 "$OUT/little_$only.log"; cp .dev/little/model.json "$OUT/" 2>/dev/null
    for r in .dev/little/runs/*/; do tail -c 300000 "$r/metrics.jsonl" > "$OUT/$(basename "$r").metrics.jsonl" 2>/dev/null; done
    python3 benchmarks/little_data.py table .dev/little
    exit 0
fi

step "GPU tests"
XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n 12"
timeout 330 python3 -m pytest -q -p no:cacheprovider $XD --timeout 200 -m gpu tests -rfE > "$OUT/suite.log" 2>&1
echo "suite rc=$?"; grep -E "passed|failed" "$OUT/suite.log" | tail -1; grep -E "^(FAILED|ERROR)" "$OUT/suite.log" | head -20
[ "$only" = suite ] && exit 0

step "training against torch.compile"
timeout 200 python3 benchmarks/gpu_train.py --presets small base --bf16 base --steps 10 --json "$OUT/gpu_train.json" \
    > "$OUT/gpu_train.log" 2>&1; grep -E "tok/s|peak" "$OUT/gpu_train.log"
step "scoring"
timeout 100 python3 benchmarks/score.py --device cuda --preset base --mb 8 --reference-mb 0.2 --hf --rounds 2 \
    > "$OUT/score.log" 2>&1; tail -6 "$OUT/score.log"
step "generation"
timeout 90 python3 benchmarks/generate.py --device cuda --presets base --samples 1,64 --tokens 512 \
    > "$OUT/generate.log" 2>&1; tail -4 "$OUT/generate.log"
step "the compressor"
timeout 45 python3 benchmarks/compress.py --preset base --device cuda --precision fp16 --train-steps 0 --bytes 400000 \
    > "$OUT/compress.log" 2>&1; tail -4 "$OUT/compress.log"
step end
