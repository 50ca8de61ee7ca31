// Scoring: each window's summed negative log-likelihood of its counted targets, so that only B
// numbers leave the device (bytemodel.ops.cuda_score.window_nll; NumPy twin ops/score_ops.py).
//
// logits (B*L, ld) act_t, the first V columns count; targets (B*L,) int32; mask (B*L,) uint8
// (0: the target counts for nothing; a null pointer: every target counts); out (B,) double.
//   out[b] = sum over counted t of (lse_t - logit_t[target_t]),  lse_t = log sum_c exp(logit_t[c])
// The log-softmax is float32 (expf/logf, not the fast intrinsics), each row's loss is added in
// float64. One block per window, SCORE_WARPS warps; warp w takes rows w, w + SCORE_WARPS, ... in
// order and the warps' partial sums are added in warp order: the result is the same every run.
#include "common.cuh"

#define SCORE_WARPS 16

extern "C" __global__ void __launch_bounds__(SCORE_WARPS * 32) score_window_nll(
        const act_t* __restrict__ logits, const int* __restrict__ targets, const unsigned char* __restrict__ mask,
        double* __restrict__ out, int L, int ld, int V) {
    __shared__ double part[SCORE_WARPS];
    const int b = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    double acc = 0.0;
    for (int t = warp; t < L; t += SCORE_WARPS) {
        const i64 row = (i64)b * L + t;
        if (mask != nullptr && mask[row] == 0) continue;
        const act_t* x = logits + row * ld;
        float m = -INFINITY;
        for (int c = lane; c < V; c += 32) m = fmaxf(m, to_f(x[c]));
        m = warp_max(m);
        float s = 0.f;
        for (int c = lane; c < V; c += 32) s += expf(to_f(x[c]) - m);
        s = warp_sum(s);
        if (lane == 0) acc += (double)((m + logf(s)) - to_f(x[targets[row]]));
    }
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int w = 0; w < SCORE_WARPS; w++) total += part[w];
        out[b] = total;
    }
}
