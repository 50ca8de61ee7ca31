// The flat-buffer kernels of the optimizer (compute_weights, global_norm, adamw_step of
// numpy_ops). Launched by cuda_ops.
//
// Shapes: every buffer is the flat parameter layout (n,), fp32 (master weights, gradients, both
// AdamW moments, the decay mask) or act_t (the compute copy); partial (nblocks,) fp32; the norm a
// 0-d fp32. The norm is summed in a fixed order (no atomics): the same gradients give the same
// bits, and so the same clip factor and skip decision.
#include "common.cuh"

extern "C" __global__ void cast_f32_act(const float* __restrict__ src, act_t* __restrict__ dst, long long n) {
    i64 n4 = n / 4;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (i64)gridDim.x * blockDim.x) {
        float4 a = reinterpret_cast<const float4*>(src)[i];
        act2_t lo = from_f2(a.x, a.y), hi = from_f2(a.z, a.w);
        reinterpret_cast<act2_t*>(dst)[2 * i] = lo;
        reinterpret_cast<act2_t*>(dst)[2 * i + 1] = hi;
    }
    for (i64 i = n4 * 4 + (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        dst[i] = from_f(src[i]);
}

// partial[block] = sum of squares over a grid-stride slice: each thread sums its elements in
// order, then fixed shuffle and shared-memory trees; deterministic for a fixed grid (cuda_ops
// launches 2 blocks per SM, so the same GPU model gives the same bits)
extern "C" __global__ void sumsq_partial(const float* __restrict__ x, long long n, float* __restrict__ partial) {
    __shared__ float red[32];
    float s = 0.f;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        float v = x[i];
        s += v * v;
    }
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.f;
        s = warp_sum(s);
        if (threadIdx.x == 0) partial[blockIdx.x] = s;
    }
}

// out[0] = sqrt(sum(partial)); one block
extern "C" __global__ void sumsq_final(const float* __restrict__ partial, int np, float* __restrict__ out) {
    __shared__ float red[32];
    float s = 0.f;
    for (int i = threadIdx.x; i < np; i += blockDim.x) s += partial[i];
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.f;
        s = warp_sum(s);
        if (threadIdx.x == 0) out[0] = sqrtf(s);
    }
}

// AdamW (PyTorch's form: decoupled decay p *= 1 - lr*wd where mask is 1), one launch over the flat
// buffer. The gradient is multiplied by grad_scale (undo the loss scale, maybe times a clip factor) and, when clip > 0 and the
// unscaled norm exceeds clip, by clip / norm. If the norm (read on the device, so the host need not
// wait) is not finite, nothing changes: the step is skipped. Also writes the compute-dtype copy of
// the updated weights when pc is not null. n is a multiple of 4.
extern "C" __global__ void adamw_step(float* __restrict__ p, const float* __restrict__ g,
                                      float* __restrict__ m, float* __restrict__ v,
                                      const float* __restrict__ mask, act_t* __restrict__ pc,
                                      long long n, float lr, float b1, float b2, float eps, float wd,
                                      float bc1, float bc2, const float* __restrict__ norm_ptr,
                                      float grad_scale, float clip) {
    float nrm = norm_ptr ? norm_ptr[0] * grad_scale : 0.f;
    if (!isfinite(nrm)) return;
    float mult = grad_scale * ((clip > 0.f && nrm > clip) ? clip / (nrm + 1e-6f) : 1.f);
    i64 n4 = n / 4;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (i64)gridDim.x * blockDim.x) {
        float4 pp = reinterpret_cast<float4*>(p)[i];
        float4 gg = reinterpret_cast<const float4*>(g)[i];
        float4 mm = reinterpret_cast<float4*>(m)[i];
        float4 vv = reinterpret_cast<float4*>(v)[i];
        float4 mk = reinterpret_cast<const float4*>(mask)[i];
        float* P = &pp.x; float* G = &gg.x; float* M = &mm.x; float* Vv = &vv.x; float* K = &mk.x;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float gr = G[j] * mult;
            M[j] = b1 * M[j] + (1.f - b1) * gr;
            Vv[j] = b2 * Vv[j] + (1.f - b2) * gr * gr;
            float upd = (M[j] / bc1) / (sqrtf(Vv[j] / bc2) + eps);
            P[j] = P[j] * (1.f - lr * wd * K[j]) - lr * upd;
        }
        reinterpret_cast<float4*>(p)[i] = pp;
        reinterpret_cast<float4*>(m)[i] = mm;
        reinterpret_cast<float4*>(v)[i] = vv;
        if (pc) {
            reinterpret_cast<act2_t*>(pc)[2 * i] = from_f2(pp.x, pp.y);
            reinterpret_cast<act2_t*>(pc)[2 * i + 1] = from_f2(pp.z, pp.w);
        }
    }
}
