// Token embedding (embedding_forward / embedding_backward of numpy_ops). Launched by cuda_ops.
//
// Shapes: wte (V, C) act_t, idx (N,) int32, out / dout (N, C) act_t, dwte (V, C) fp32 (+=).
// The backward never adds with floating-point atomics: each vocabulary row is summed by one
// block in the order of the positions that hold it, so the same ids and dout give the same bits.
#include "common.cuh"

// out[n] = wte[idx[n]]
extern "C" __global__ void embedding_fwd(const act_t* __restrict__ wte, const int* __restrict__ idx,
                                         act_t* __restrict__ out, long long N, int C) {
    i64 total = N * C;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        i64 n = i / C; int c = i % C;
        out[i] = wte[(i64)idx[n] * C + c];
    }
}

// dwte[v] += sum of dout[n] over the n with idx[n] == v, positions in increasing order. One block
// per vocabulary row v scans all N ids, lists the positions holding v (warp ballots, in order)
// and sums those dout rows in registers; each thread owns 8 columns (C % 8 == 0,
// C <= 8 * blockDim.x). For small vocabularies (V <= 8192): no sort, no contention.
extern "C" __global__ void embedding_bwd_rows(const act_t* __restrict__ dout, const int* __restrict__ idx,
                                              float* __restrict__ dwte, long long N, int C) {
    __shared__ int pos[1024];
    __shared__ int wcount[32];
    const int v = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nw = blockDim.x / 32;
    const int c = tid * 8;
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i] = 0.f;
    for (i64 base = 0; base < N; base += blockDim.x) {
        i64 n = base + tid;
        bool hit = n < N && idx[n] == v;
        unsigned m = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) wcount[warp] = __popc(m);
        __syncthreads();
        int off = 0, total = 0;
        for (int w = 0; w < nw; w++) { if (w < warp) off += wcount[w]; total += wcount[w]; }
        if (hit) pos[off + __popc(m & ((1u << lane) - 1))] = (int)(n - base);
        __syncthreads();
        if (c < C) {
            for (int j = 0; j < total; j++) {
                float f[8];
                load_row<8>(dout + (base + pos[j]) * C, c, f);
#pragma unroll
                for (int i = 0; i < 8; i++) acc[i] += f[i];
            }
        }
        __syncthreads();
    }
    if (c < C) {
        float* dst = dwte + (i64)v * C + c;
#pragma unroll
        for (int i = 0; i < 8; i++) dst[i] += acc[i];
    }
}

// Any vocabulary and width: the positions sorted by id (order (N,), a stable sort of idx) and
// each id's first slot in that order (starts (V + 1,)), so row v sums dout[order[j]] for
// j in [starts[v], starts[v + 1]), in order. Grid (V, ceil(C / blockDim.x)), a thread per column.
extern "C" __global__ void embedding_bwd_sorted(const act_t* __restrict__ dout, const int* __restrict__ order,
                                                const int* __restrict__ starts, float* __restrict__ dwte,
                                                int C) {
    const int v = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int j0 = starts[v], j1 = starts[v + 1];
    if (j0 == j1) return;
    float acc = 0.f;
    for (int j = j0; j < j1; j++) acc += to_f(dout[(i64)order[j] * C + c]);
    dwte[(i64)v * C + c] += acc;
}
