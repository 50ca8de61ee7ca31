// Softmax + cross-entropy (cross_entropy_forward / cross_entropy_backward of numpy_ops), with an
// optional 0/1 loss mask per row. Launched by cuda_ops.
//
// Shapes: logits, dlogits (N, V) act_t; targets (N,) int32; mask (N,) uint8 or null (every row
// counts); losses, lse, dlosses (N,) fp32.
//   forward:  lse = log sum exp(logits), losses = lse - logits[target] (natural log)
//   backward: dlogits = (softmax - onehot(target)) * dlosses, softmax recomputed from the logits
// The forward keeps only the row log-sum-exp (no probability tensor). A masked row (mask 0)
// counts for nothing: its loss and lse are written as 0 without reading its logits, and its
// gradient row is exactly 0 whatever dlosses holds (fine-tuning on completions or assistant
// turns only). Warp-shuffle trees in a fixed order: deterministic.
#include "common.cuh"

// one warp per row, 8 rows per 256-thread block
extern "C" __global__ void ce_fwd(const act_t* __restrict__ logits, const int* __restrict__ targets,
                                  const unsigned char* __restrict__ mask, float* __restrict__ losses,
                                  float* __restrict__ lse, long long N, int V) {
    i64 row = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    if (mask && !mask[row]) {               // the whole warp leaves together: no shuffles below
        if (lane == 0) { losses[row] = 0.f; lse[row] = 0.f; }
        return;
    }
    const act_t* x = logits + row * V;
    float m = -INFINITY;
    for (int c = lane; c < V; c += 32) m = fmaxf(m, to_f(x[c]));
    m = warp_max(m);
    float s = 0.f;
    for (int c = lane; c < V; c += 32) s += __expf(to_f(x[c]) - m);
    s = warp_sum(s);
    if (lane == 0) {
        float l = m + __logf(s);
        lse[row] = l;
        losses[row] = l - to_f(x[targets[row]]);
    }
}

// dlogits = (softmax - onehot) * dlosses on counted rows, 0 on masked rows
extern "C" __global__ void ce_bwd(const act_t* __restrict__ logits, const int* __restrict__ targets,
                                  const unsigned char* __restrict__ mask, const float* __restrict__ lse,
                                  const float* __restrict__ dlosses, act_t* __restrict__ dlogits,
                                  long long N, int V) {
    i64 total = N * V;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        i64 n = i / V; int c = i % V;
        float d = 0.f;
        if (!mask || mask[n]) {
            float p = __expf(to_f(logits[i]) - lse[n]);
            d = (p - (c == targets[n] ? 1.f : 0.f)) * dlosses[n];
        }
        dlogits[i] = from_f(d);
    }
}
