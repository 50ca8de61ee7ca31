// Dropout (dropout_forward / dropout_backward): the twin of numpy_ops' dropout ops, drawing the
// very same mask bits. Element g of the whole batch (g = offset + the flat index) reads byte
// g % 4 of the word h(g / 4) = fmix32(fmix32((g / 4) ^ k0) ^ k1) (murmur3's finaliser, twice,
// keyed) and is kept when that byte >= thr; kept ones are multiplied by scale = 256 / (256 - thr).
// Nothing is stored: the backward pass draws the mask again from the same (k0, k1, offset), a few
// integer operations per element and no memory. One hash serves 4 elements: with one per 2 the
// forward kernel ran 1.9x the time of a plain add on the H200 (bf16, 32x1024x768), integer-bound.
//
// Shapes: x, res, out (n,) act_t, any array flattened.
// dropout_res_*: out = res + dropout(x) (a residual branch's forward, the add in the same pass);
// dropout_mul_*: out = dropout(x) (the embedding's forward, and every backward: dx = dropout(dout)).
// _v8: 8 elements per thread (n % 8 == 0, offset % 4 == 0: two words); _v1: one element, any n.
#include "common.cuh"

// fmix32 and drop_word (the hash) are in common.cuh: flash_attn.cu draws attention dropout with them.

template <int VW, bool RES>
__device__ __forceinline__ void dropout_impl(const act_t* __restrict__ x, const act_t* __restrict__ res,
                                             act_t* __restrict__ out, i64 n, i64 off, u32 k0, u32 k1,
                                             u32 thr, float scale) {
    i64 total = n / VW;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (i64)gridDim.x * blockDim.x) {
        i64 e = t * VW;
        float f[VW], r[VW];
        load_row<VW>(x + e, 0, f);
        if (RES) load_row<VW>(res + e, 0, r);
        if (VW == 8) {
            u32 c = (u32)((off + e) >> 2);
            u32 h0 = drop_word(c, k0, k1), h1 = drop_word(c + 1, k0, k1);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                f[i] = ((h0 >> (8 * i)) & 0xffu) >= thr ? f[i] * scale : 0.f;
                f[4 + i] = ((h1 >> (8 * i)) & 0xffu) >= thr ? f[4 + i] * scale : 0.f;
            }
        } else {
            i64 g = off + e;
            u32 h = drop_word((u32)(g >> 2), k0, k1);
            f[0] = ((h >> (8 * (g & 3))) & 0xffu) >= thr ? f[0] * scale : 0.f;
        }
        if (RES) {
#pragma unroll
            for (int i = 0; i < VW; i++) f[i] += r[i];
        }
        store_row<VW>(out + e, 0, f);
    }
}

#define DROPOUT_ARGS i64 n, i64 off, u32 k0, u32 k1, u32 thr, float scale
extern "C" __global__ void dropout_mul_v8(const act_t* x, act_t* out, DROPOUT_ARGS) {
    dropout_impl<8, false>(x, nullptr, out, n, off, k0, k1, thr, scale);
}
extern "C" __global__ void dropout_mul_v1(const act_t* x, act_t* out, DROPOUT_ARGS) {
    dropout_impl<1, false>(x, nullptr, out, n, off, k0, k1, thr, scale);
}
extern "C" __global__ void dropout_res_v8(const act_t* x, const act_t* res, act_t* out, DROPOUT_ARGS) {
    dropout_impl<8, true>(x, res, out, n, off, k0, k1, thr, scale);
}
extern "C" __global__ void dropout_res_v1(const act_t* x, const act_t* res, act_t* out, DROPOUT_ARGS) {
    dropout_impl<1, true>(x, res, out, n, off, k0, k1, thr, scale);
}
