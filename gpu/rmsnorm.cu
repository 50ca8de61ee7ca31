// RMSNorm (rmsnorm_forward / rmsnorm_backward of numpy_ops). Launched by cuda_ops.
//
// Shapes: x, out, dout, dx, res, ddx (N, C) act_t; g (C,) act_t; rstd (N,) fp32; dg (C,) fp32 (+=);
// partial (nblk, C) fp32 scratch, nblk = ceil(N / rows_per_block).
//   forward:  out = x * rstd * g, rstd = 1 / sqrt(mean(x^2) + eps)
//   backward: dx = (dout*g - xhat * mean(dout*g*xhat)) * rstd (+ res), dg += sum_rows dout * xhat
// The dg sum is deterministic: each block writes its rows' sum into its own partial row (warps
// merged in warp order), and rmsnorm_dg_reduce adds the partial rows in block order. No
// floating-point atomics anywhere.
#include "common.cuh"

// One warp per row. VW = 8: 16-byte accesses (C % 8 == 0); VW = 1: any C.
template <int VW>
__device__ __forceinline__ void rmsnorm_fwd_impl(const act_t* __restrict__ x, const act_t* __restrict__ g,
                                                 act_t* __restrict__ out, float* __restrict__ rstd,
                                                 long long N, int C, float eps) {
    i64 row = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    const act_t* xr = x + row * C;
    float ss = 0.f;
    for (int c = lane * VW; c < C; c += 32 * VW) {
        float f[VW];
        load_row<VW>(xr, c, f);
#pragma unroll
        for (int i = 0; i < VW; i++) ss += f[i] * f[i];
    }
    ss = warp_sum(ss);
    float r = rsqrtf(ss / C + eps);
    if (lane == 0) rstd[row] = r;
    for (int c = lane * VW; c < C; c += 32 * VW) {
        float f[VW], w[VW];
        load_row<VW>(xr, c, f);
        load_row<VW>(g, c, w);
#pragma unroll
        for (int i = 0; i < VW; i++) f[i] = f[i] * r * w[i];
        store_row<VW>(out + row * C, c, f);
    }
}
extern "C" __global__ void rmsnorm_fwd(const act_t* x, const act_t* g, act_t* out, float* rstd, long long N, int C, float eps) {
    rmsnorm_fwd_impl<1>(x, g, out, rstd, N, C, eps);
}
extern "C" __global__ void rmsnorm_fwd_v8(const act_t* x, const act_t* g, act_t* out, float* rstd, long long N, int C, float eps) {
    rmsnorm_fwd_impl<8>(x, g, out, rstd, N, C, eps);
}

// Backward, any width: dx (+ res) only, one warp per row, `rows_per_block` rows a block; the dg
// partial rows come from rmsnorm_dg_part. Launched for widths the register version below does
// not take (C % 8 != 0 or C > 1024).
extern "C" __global__ void rmsnorm_bwd(const act_t* __restrict__ dout, const act_t* __restrict__ x,
                                       const float* __restrict__ rstd, const act_t* __restrict__ g,
                                       act_t* __restrict__ dx, long long N, int C, int rows_per_block,
                                       const act_t* __restrict__ res) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    i64 r0 = (i64)blockIdx.x * rows_per_block;
    i64 r1 = min((i64)N, r0 + rows_per_block);
    for (i64 row = r0 + warp; row < r1; row += nw) {
        const act_t* dr = dout + row * C;
        const act_t* xr = x + row * C;
        float r = rstd[row];
        float dot = 0.f;
        for (int c = lane; c < C; c += 32) dot += to_f(dr[c]) * to_f(g[c]) * to_f(xr[c]);
        dot = warp_sum(dot) * r / C;     // mean(dxhat * xhat)
        for (int c = lane; c < C; c += 32) {
            float o = (to_f(dr[c]) * to_f(g[c]) - to_f(xr[c]) * r * dot) * r;
            if (res) o += to_f(res[row * C + c]);
            dx[row * C + c] = from_f(o);
        }
    }
}

// partial[b, c] = sum over the rows of block b (rows_per_block of them, in order) of
// dout * x * rstd. Grid (nblk, ceil(C / blockDim.x)), a thread per column.
extern "C" __global__ void rmsnorm_dg_part(const act_t* __restrict__ dout, const act_t* __restrict__ x,
                                           const float* __restrict__ rstd, float* __restrict__ partial,
                                           long long N, int C, int rows_per_block) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    i64 r0 = (i64)blockIdx.x * rows_per_block;
    i64 r1 = min((i64)N, r0 + rows_per_block);
    float acc = 0.f;
    for (i64 row = r0; row < r1; row++) acc += to_f(dout[row * C + c]) * (to_f(x[row * C + c]) * rstd[row]);
    partial[(i64)blockIdx.x * C + c] = acc;
}

// Backward with the dg partials in registers: lane owns columns j*256 + lane*8 .. +7 for
// j < NCH = ceil(C / 256) (C % 8 == 0, C <= 1024); the block's warps are merged in shared memory
// in warp order and written to the block's own partial row. With ddx (not null): also
// ddx = dropout(dx) in the same pass, the mask of dropout.cu's dropout_mul_v8 for (doff, k0, k1,
// thr, dscale) applied to dx as stored (rounded to act_t), so the same bits as that kernel run on
// dx after this one (doff % 4 == 0): the residual branch's gradient beside the stream's.
template <int NCH>
__device__ __forceinline__ void rmsnorm_bwd_reg_impl(const act_t* __restrict__ dout, const act_t* __restrict__ x,
                                                     const float* __restrict__ rstd, const act_t* __restrict__ g,
                                                     act_t* __restrict__ dx, float* __restrict__ partial,
                                                     long long N, int C, int rows_per_block,
                                                     const act_t* __restrict__ res, act_t* __restrict__ ddx,
                                                     i64 doff, u32 k0, u32 k1, u32 thr, float dscale) {
    extern __shared__ float red[];     // [nwarps][C]
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    float acc[NCH][8], w[NCH][8];
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        int c = j * 256 + lane * 8;
        if (c < C) load_row<8>(g, c, w[j]);
#pragma unroll
        for (int i = 0; i < 8; i++) acc[j][i] = 0.f;
    }
    i64 r0 = (i64)blockIdx.x * rows_per_block;
    i64 r1 = min((i64)N, r0 + rows_per_block);
    for (i64 row = r0 + warp; row < r1; row += nw) {
        const act_t* dr = dout + row * C;
        const act_t* xr = x + row * C;
        float r = rstd[row];
        float d[NCH][8], f[NCH][8];
        float dot = 0.f;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int c = j * 256 + lane * 8;
            if (c < C) {
                load_row<8>(dr, c, d[j]); load_row<8>(xr, c, f[j]);
#pragma unroll
                for (int i = 0; i < 8; i++) dot += d[j][i] * w[j][i] * f[j][i];
            }
        }
        dot = warp_sum(dot) * r / C;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int c = j * 256 + lane * 8;
            if (c < C) {
                float o[8];
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float xh = f[j][i] * r;
                    o[i] = (d[j][i] * w[j][i] - xh * dot) * r;
                    acc[j][i] += d[j][i] * xh;
                }
                if (res) {
                    float rr[8];
                    load_row<8>(res + row * C, c, rr);
#pragma unroll
                    for (int i = 0; i < 8; i++) o[i] += rr[i];
                }
                store_row<8>(dx + row * C, c, o);
                if (ddx) {
                    const u32 w = (u32)((doff + row * C + c) >> 2);
                    const u32 h0 = drop_word(w, k0, k1), h1 = drop_word(w + 1, k0, k1);
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        const u32 byte = ((i < 4 ? h0 : h1) >> (8 * (i % 4))) & 0xffu;
                        o[i] = byte >= thr ? to_f(from_f(o[i])) * dscale : 0.f;
                    }
                    store_row<8>(ddx + row * C, c, o);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        int c = j * 256 + lane * 8;
        if (c < C)
#pragma unroll
            for (int i = 0; i < 8; i++) red[warp * C + c + i] = acc[j][i];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.f;
        for (int k = 0; k < nw; k++) s += red[k * C + c];
        partial[(i64)blockIdx.x * C + c] = s;
    }
}
#define RMS_BWD_REG(n) \
extern "C" __global__ void rmsnorm_bwd_r##n(const act_t* dout, const act_t* x, const float* rstd, const act_t* g, \
                                           act_t* dx, float* partial, long long N, int C, int rpb, const act_t* res, \
                                           act_t* ddx, i64 doff, u32 k0, u32 k1, u32 thr, float dscale) { \
    rmsnorm_bwd_reg_impl<n>(dout, x, rstd, g, dx, partial, N, C, rpb, res, ddx, doff, k0, k1, thr, dscale); }
RMS_BWD_REG(1)
RMS_BWD_REG(2)
RMS_BWD_REG(3)
RMS_BWD_REG(4)

// dg[c] += sum over b of partial[b, c], in a fixed order: thread (cx, cy) of a 256-thread block
// sums the rows b = cy, cy + 8, ... of column blockIdx.x * 32 + cx, then the 8 sums are added
// in cy order. Grid ceil(C / 32).
extern "C" __global__ void rmsnorm_dg_reduce(const float* __restrict__ partial, int nblk, int C,
                                             float* __restrict__ dg) {
    __shared__ float red[8][33];
    const int cx = threadIdx.x % 32, cy = threadIdx.x / 32, c = blockIdx.x * 32 + cx;
    float s = 0.f;
    if (c < C)
        for (int b = cy; b < nblk; b += 8) s += partial[(i64)b * C + c];
    red[cy][cx] = s;
    __syncthreads();
    if (cy == 0 && c < C) {
        float t = 0.f;
#pragma unroll
        for (int k = 0; k < 8; k++) t += red[k][cx];
        dg[c] += t;
    }
}
