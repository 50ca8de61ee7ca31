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

// The residual add and the RMSNorm after it, one warp a row (C % 8 == 0): xo = x + y rounded to
// act_t as residual.cu's add_v8 rounds it, then out = xo * rstd * g as rmsnorm.cu's rmsnorm_fwd_v8
// computes it from xo (the same loads, sums and products in the same order; rstd is not kept: the
// decode step has no backward). One launch instead of two.
extern "C" __global__ void step_add_rmsnorm(const act_t* __restrict__ x, const act_t* __restrict__ y,
                                            const act_t* __restrict__ g, act_t* xo, act_t* __restrict__ out,
                                            long long N, int C, float eps) {
    const i64 row = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;
    const act_t* xr = x + row * C;
    const act_t* yr = y + row * C;
    act_t* xw = xo + row * C;
    float ss = 0.f;
    for (int c = lane * 8; c < C; c += 32 * 8) {
        const vec8 a = *reinterpret_cast<const vec8*>(xr + c), b = *reinterpret_cast<const vec8*>(yr + c);
        vec8 z;
#pragma unroll
        for (int e = 0; e < 8; e++) z.v[e] = from_f(to_f(a.v[e]) + to_f(b.v[e]));
        *reinterpret_cast<vec8*>(xw + c) = z;
        float f[8];
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = to_f(z.v[i]);   // the rounded sums, as the norm reads them
#pragma unroll
        for (int i = 0; i < 8; i++) ss += f[i] * f[i];
    }
    ss = warp_sum(ss);
    const float r = rsqrtf(ss / C + eps);
    for (int c = lane * 8; c < C; c += 32 * 8) {       // xw: this lane's own writes, read back
        float f[8], w[8];
        load_row<8>(xw, c, f);
        load_row<8>(g, c, w);
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = f[i] * r * w[i];
        store_row<8>(out + row * C, c, f);
    }
}

// RoPE on the step's one token and the cache write in one pass (T = 1, D % 16 == 0): the q heads
// of qkv (B, (H+2K)*D) rotated into q (B, H*D), the k heads rotated straight into the cache row
// state[0], the v heads copied there. The rotation is rope.cu's rope_qk_fwd_v8's, term for term
// (cos1, sin1: the row step_rope_row took), so q and the cache hold the same bits as after
// qkv_rope_forward and the cache write.
extern "C" __global__ void step_rope_cache(const act_t* __restrict__ qkv, const act_t* __restrict__ cos1,
                                           const act_t* __restrict__ sin1, act_t* __restrict__ q,
                                           act_t* __restrict__ kc, act_t* __restrict__ vc,
                                           const int* __restrict__ state, int B, int H, int K, int S, int D) {
    const int h2 = D / 2, h8 = D / 16, J = H + 2 * K;
    const i64 total = (i64)B * J * h8;
    const int pos = state[0];
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
        const int i = (int)(idx % h8) * 8;
        const i64 rest = idx / h8;
        const int j = (int)(rest % J);
        const i64 b = rest / J;
        const act_t* src = qkv + b * J * D + (i64)j * D;
        const vec8 a = *reinterpret_cast<const vec8*>(src + i), c2 = *reinterpret_cast<const vec8*>(src + i + h2);
        if (j < H + K) {
            act_t* dst = j < H ? q + (b * H + j) * D : kc + ((b * K + (j - H)) * S + pos) * D;
            float cs[8], sn[8];
            load_row<8>(cos1, i, cs);
            load_row<8>(sin1, i, sn);
            vec8 o1, o2;
            rope_pairs8(a, c2, cs, sn, o1, o2);
            *reinterpret_cast<vec8*>(dst + i) = o1;
            *reinterpret_cast<vec8*>(dst + i + h2) = o2;
        } else {
            act_t* dst = vc + ((b * K + (j - H - K)) * S + pos) * D;
            *reinterpret_cast<vec8*>(dst + i) = a;
            *reinterpret_cast<vec8*>(dst + i + h2) = c2;
        }
    }
}
