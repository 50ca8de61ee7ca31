// The batched decode step through the backend's own ops (cuBLAS products), made position-free so it
// can be captured once as a CUDA graph (bytemodel.ops.cuda_decode, the "blas-graph" path): the two
// places where the cache position enters read it from device memory (state[0]) instead of the host.
//
// state (int[4]): [0] pos, the cache row this step writes; [1] t (the sampler's column).
// Shapes: B batch, K kv heads, D head dim, S cache length; half = D / 2.
#include "common.cuh"

// RoPE's row for this step: cos1/sin1 (half,) = cos/sin (S, half) at row state[0]
extern "C" __global__ void step_rope_row(const act_t* __restrict__ cos, const act_t* __restrict__ sin,
                                         act_t* __restrict__ cos1, act_t* __restrict__ sin1,
                                         const int* __restrict__ state, int half) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < half) {
        const i64 r = (i64)state[0] * half;
        cos1[i] = cos[r + i];
        sin1[i] = sin[r + i];
    }
}

// the new keys and values k, v (B*K, D) contiguous -> cache kc, vc (B*K, S, D) at row state[0]
extern "C" __global__ void step_cache_write(const act_t* __restrict__ k, const act_t* __restrict__ v,
                                            act_t* __restrict__ kc, act_t* __restrict__ vc,
                                            const int* __restrict__ state, int BK, int S, int D) {
    const i64 n = (i64)BK * D;
    const int pos = state[0];
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 r = i / D, d = i - r * D;
        const i64 o = (r * S + pos) * D + d;
        kc[o] = k[i];
        vc[o] = v[i];
    }
}

// the same copies read where the projection left them: k, v the (B, K, 1, D) strided views of
// qkv_rope_forward's buffers (element strides ksb, vsb per sequence and ksh, vsh per head, D
// contiguous), so no contiguous copies of them go first
extern "C" __global__ void step_cache_write_views(const act_t* __restrict__ k, const act_t* __restrict__ v,
                                                  i64 ksb, i64 ksh, i64 vsb, i64 vsh,
                                                  act_t* __restrict__ kc, act_t* __restrict__ vc,
                                                  const int* __restrict__ state, int B, int K, int S, int D) {
    const i64 n = (i64)B * K * D;
    const int pos = state[0];
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 r = i / D, d = i - r * D, b = r / K, h = r - b * K;
        const i64 o = (r * S + pos) * D + d;
        kc[o] = k[b * ksb + h * ksh + d];
        vc[o] = v[b * vsb + h * vsh + d];
    }
}
