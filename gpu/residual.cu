// The residual stream's update (add of numpy_ops): out = a + b, elementwise, fp32 math.
// Launched by cuda_ops. Shapes: a, b, out (n,) act_t with n % 8 == 0 (other sizes take CuPy's
// a + b). A pure map: deterministic.
#include "common.cuh"

// 8 activations (one 16-byte access in fp16/bf16) per thread and iteration; n8 = n / 8
extern "C" __global__ void add_v8(const act_t* __restrict__ a, const act_t* __restrict__ b,
                                  act_t* __restrict__ out, long long n8) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (i64)gridDim.x * blockDim.x) {
        vec8 x = reinterpret_cast<const vec8*>(a)[i], y = reinterpret_cast<const vec8*>(b)[i], z;
#pragma unroll
        for (int e = 0; e < 8; e++) z.v[e] = from_f(to_f(x.v[e]) + to_f(y.v[e]));
        reinterpret_cast<vec8*>(out)[i] = z;
    }
}
