// SwiGLU (swiglu_forward / swiglu_backward of numpy_ops). Launched by cuda_ops.
//
// Shapes: h, dh (N, 2F) act_t = [gate | up]; out, dout (N, F) act_t.
//   forward:  out = silu(gate) * up
//   backward: dgate = dout * up * sig * (1 + gate * (1 - sig)), dup = dout * silu(gate)
// fp32 math; VW = 8 moves 16 bytes per access (F % 8 == 0), VW = 1 any F. Pure maps: deterministic.
#include "common.cuh"

template <int VW>
__device__ __forceinline__ void swiglu_fwd_impl(const act_t* __restrict__ h, act_t* __restrict__ out, long long N, int F) {
    i64 total = N * F / VW;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
        i64 e = idx * VW; i64 n = e / F; int f = e % F;
        float gt[VW], up[VW], o[VW];
        load_row<VW>(h + n * 2 * F, f, gt);
        load_row<VW>(h + n * 2 * F + F, f, up);
#pragma unroll
        for (int i = 0; i < VW; i++) o[i] = gt[i] / (1.f + __expf(-gt[i])) * up[i];
        store_row<VW>(out, e, o);
    }
}
extern "C" __global__ void swiglu_fwd(const act_t* h, act_t* out, long long N, int F) { swiglu_fwd_impl<1>(h, out, N, F); }
extern "C" __global__ void swiglu_fwd_v8(const act_t* h, act_t* out, long long N, int F) { swiglu_fwd_impl<8>(h, out, N, F); }

template <int VW>
__device__ __forceinline__ void swiglu_bwd_impl(const act_t* __restrict__ dout, const act_t* __restrict__ h,
                                                act_t* __restrict__ dh, long long N, int F) {
    i64 total = N * F / VW;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
        i64 e = idx * VW; i64 n = e / F; int f = e % F;
        float gt[VW], up[VW], d[VW], dg[VW], du[VW];
        load_row<VW>(h + n * 2 * F, f, gt);
        load_row<VW>(h + n * 2 * F + F, f, up);
        load_row<VW>(dout, e, d);
#pragma unroll
        for (int i = 0; i < VW; i++) {
            float sig = 1.f / (1.f + __expf(-gt[i]));
            float silu = gt[i] * sig;
            du[i] = d[i] * silu;
            dg[i] = d[i] * up[i] * (sig * (1.f + gt[i] * (1.f - sig)));
        }
        store_row<VW>(dh + n * 2 * F, f, dg);
        store_row<VW>(dh + n * 2 * F + F, f, du);
    }
}
extern "C" __global__ void swiglu_bwd(const act_t* dout, const act_t* h, act_t* dh, long long N, int F) { swiglu_bwd_impl<1>(dout, h, dh, N, F); }
extern "C" __global__ void swiglu_bwd_v8(const act_t* dout, const act_t* h, act_t* dh, long long N, int F) { swiglu_bwd_impl<8>(dout, h, dh, N, F); }

