// Elementwise, normalisation, loss and optimizer kernels of the GPU engine.
// Each kernel is the twin of an op in bytemodel/ops/numpy_ops.py (names below); cuda_ops.py
// launches them. act_t is fp16 / bf16 / fp32 per compiled module (common.cuh); all arithmetic is
// done in fp32. Kernels with a _v8 suffix move 8 activations (16 bytes in fp16) per access and
// need the row length to be a multiple of 8; the plain ones take any size.
//
// Legend: N rows (= B*T), C d_model, F d_ff, V vocab, H/K query/kv heads, D head dim.
#include "common.cuh"

// ------------------------------------------------------------------------------------------------
// embedding: out[n] = wte[idx[n]]  (embedding_forward); dwte[idx[n]] += dout[n] (embedding_backward)
extern "C" __global__ void embedding_fwd(const act_t* __restrict__ wte, const int* __restrict__ idx,
                                         act_t* __restrict__ out, long long N, int C) {
    i64 total = N * C;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        i64 n = i / C; int c = i % C;
        out[i] = wte[(i64)idx[n] * C + c];
    }
}

extern "C" __global__ void embedding_bwd(const act_t* __restrict__ dout, const int* __restrict__ idx,
                                         float* __restrict__ dwte, long long N, int C) {
    i64 total = N * C;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        i64 n = i / C; int c = i % C;
        atomicAdd(dwte + (i64)idx[n] * C + c, to_f(dout[i]));
    }
}

// Deterministic, contention-free variant: one block per vocabulary row v scans all N ids, lists
// the positions holding v (warp ballots, in order) and sums those dout rows in registers; each
// thread owns 8 columns (C % 8 == 0, C <= 8 * blockDim.x). No atomics: dwte[v] += sum.
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

// ------------------------------------------------------------------------------------------------
// RMSNorm (rmsnorm_forward / rmsnorm_backward). One warp per row.
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

// dx = (dout*g - xhat * mean(dout*g*xhat)) * rstd ; dg += sum_rows dout * xhat
// A block takes `rows_per_block` rows, one warp per row at a time; dg partials collect in shared
// memory (C floats) and go to global memory with one atomicAdd per column per block. Launched
// for widths the register version below does not take (C % 8 != 0 or C > 1024).
template <int VW>
__device__ __forceinline__ void rmsnorm_bwd_impl(const act_t* __restrict__ dout, const act_t* __restrict__ x,
                                                 const float* __restrict__ rstd, const act_t* __restrict__ g,
                                                 act_t* __restrict__ dx, float* __restrict__ dg,
                                                 long long N, int C, int rows_per_block,
                                                 const act_t* __restrict__ res) {
    extern __shared__ float acc[];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    for (int c = threadIdx.x; c < C; c += blockDim.x) acc[c] = 0.f;
    __syncthreads();
    i64 r0 = (i64)blockIdx.x * rows_per_block;
    i64 r1 = min((i64)N, r0 + rows_per_block);
    for (i64 row = r0 + warp; row < r1; row += nw) {
        const act_t* dr = dout + row * C;
        const act_t* xr = x + row * C;
        float r = rstd[row];
        float dot = 0.f;
        for (int c = lane * VW; c < C; c += 32 * VW) {
            float d[VW], f[VW], w[VW];
            load_row<VW>(dr, c, d); load_row<VW>(xr, c, f); load_row<VW>(g, c, w);
#pragma unroll
            for (int i = 0; i < VW; i++) dot += d[i] * w[i] * f[i];
        }
        dot = warp_sum(dot) * r / C;     // mean(dxhat * xhat)
        for (int c = lane * VW; c < C; c += 32 * VW) {
            float d[VW], f[VW], w[VW], o[VW];
            load_row<VW>(dr, c, d); load_row<VW>(xr, c, f); load_row<VW>(g, c, w);
#pragma unroll
            for (int i = 0; i < VW; i++) {
                float xh = f[i] * r;
                o[i] = (d[i] * w[i] - xh * dot) * r;
                atomicAdd(acc + c + i, d[i] * xh);
            }
            if (res) {
                float rr[VW];
                load_row<VW>(res + row * C, c, rr);
#pragma unroll
                for (int i = 0; i < VW; i++) o[i] += rr[i];
            }
            store_row<VW>(dx + row * C, c, o);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(dg + c, acc[c]);
}
extern "C" __global__ void rmsnorm_bwd(const act_t* dout, const act_t* x, const float* rstd, const act_t* g,
                                       act_t* dx, float* dg, long long N, int C, int rpb, const act_t* res) {
    rmsnorm_bwd_impl<1>(dout, x, rstd, g, dx, dg, N, C, rpb, res);
}

// The same with the dg partials in registers: lane owns columns j*256 + lane*8 .. +7 for
// j < NCH = ceil(C / 256) (C % 8 == 0, C <= 1024); one shared-memory reduction per block.
template <int NCH>
__device__ __forceinline__ void rmsnorm_bwd_reg_impl(const act_t* __restrict__ dout, const act_t* __restrict__ x,
                                                     const float* __restrict__ rstd, const act_t* __restrict__ g,
                                                     act_t* __restrict__ dx, float* __restrict__ dg,
                                                     long long N, int C, int rows_per_block,
                                                     const act_t* __restrict__ res) {
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
        atomicAdd(dg + c, s);
    }
}
#define RMS_BWD_REG(n) \
extern "C" __global__ void rmsnorm_bwd_r##n(const act_t* dout, const act_t* x, const float* rstd, const act_t* g, \
                                           act_t* dx, float* dg, long long N, int C, int rpb, const act_t* res) { \
    rmsnorm_bwd_reg_impl<n>(dout, x, rstd, g, dx, dg, N, C, rpb, res); }
RMS_BWD_REG(1)
RMS_BWD_REG(2)
RMS_BWD_REG(3)
RMS_BWD_REG(4)

// ------------------------------------------------------------------------------------------------
// qkv split + RoPE (qkv_rope_forward / qkv_rope_backward), rotate-half convention.
// qkv (B*T, (H+2K)*D) -> q (B, H, T, D), k (B, K, T, D), v (B, K, T, D). One thread per
// (row, head, i < D/2): it handles elements i and i + D/2.
extern "C" __global__ void qkv_rope_fwd(const act_t* __restrict__ qkv, const act_t* __restrict__ cosb,
                                        const act_t* __restrict__ sinb, act_t* __restrict__ q,
                                        act_t* __restrict__ k, act_t* __restrict__ v,
                                        int B, int T, int H, int K, int D) {
    int h2 = D / 2, J = H + 2 * K;
    i64 total = (i64)B * T * J * h2;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
        int i = idx % h2; i64 rest = idx / h2;
        int j = rest % J; i64 n = rest / J;
        int t = n % T, b = n / T;
        const act_t* src = qkv + n * J * D + j * D;
        float x1 = to_f(src[i]), x2 = to_f(src[i + h2]);
        act_t* dst;
        if (j < H) dst = q + (((i64)b * H + j) * T + t) * D;
        else if (j < H + K) dst = k + (((i64)b * K + (j - H)) * T + t) * D;
        else { dst = v + (((i64)b * K + (j - H - K)) * T + t) * D; dst[i] = src[i]; dst[i + h2] = src[i + h2]; continue; }
        float c = to_f(cosb[t * h2 + i]), s = to_f(sinb[t * h2 + i]);
        dst[i] = from_f(x1 * c - x2 * s);
        dst[i + h2] = from_f(x2 * c + x1 * s);
    }
}

// the same with two neighbouring i per thread (D % 4 == 0): 4-byte accesses
extern "C" __global__ void qkv_rope_fwd_v2(const act_t* __restrict__ qkv, const act_t* __restrict__ cosb,
                                           const act_t* __restrict__ sinb, act_t* __restrict__ q,
                                           act_t* __restrict__ k, act_t* __restrict__ v,
                                           int B, int T, int H, int K, int D) {
    int h2 = D / 2, h4 = D / 4, J = H + 2 * K;
    i64 total = (i64)B * T * J * h4;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
        int i = (idx % h4) * 2; i64 rest = idx / h4;
        int j = rest % J; i64 n = rest / J;
        int t = n % T, b = n / T;
        const act_t* src = qkv + n * J * D + j * D;
        act2_t a = *reinterpret_cast<const act2_t*>(src + i), bb = *reinterpret_cast<const act2_t*>(src + i + h2);
        act_t* dst;
        if (j < H) dst = q + (((i64)b * H + j) * T + t) * D;
        else if (j < H + K) dst = k + (((i64)b * K + (j - H)) * T + t) * D;
        else {
            dst = v + (((i64)b * K + (j - H - K)) * T + t) * D;
            *reinterpret_cast<act2_t*>(dst + i) = a; *reinterpret_cast<act2_t*>(dst + i + h2) = bb;
            continue;
        }
        float2 x1 = to_f2(a), x2 = to_f2(bb);
        float2 c = to_f2(*reinterpret_cast<const act2_t*>(cosb + t * h2 + i));
        float2 s = to_f2(*reinterpret_cast<const act2_t*>(sinb + t * h2 + i));
        *reinterpret_cast<act2_t*>(dst + i) = from_f2(x1.x * c.x - x2.x * s.x, x1.y * c.y - x2.y * s.y);
        *reinterpret_cast<act2_t*>(dst + i + h2) = from_f2(x2.x * c.x + x1.x * s.x, x2.y * c.y + x1.y * s.y);
    }
}

// dq (B, H, T, D), dk/dv (B, K, T, D) -> dqkv (B*T, (H+2K)*D): rotate by -angle
extern "C" __global__ void qkv_rope_bwd(const act_t* __restrict__ dq, const act_t* __restrict__ dk,
                                        const act_t* __restrict__ dv, const act_t* __restrict__ cosb,
                                        const act_t* __restrict__ sinb, act_t* __restrict__ dqkv,
                                        int B, int T, int H, int K, int D) {
    int h2 = D / 2, J = H + 2 * K;
    i64 total = (i64)B * T * J * h2;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
        int i = idx % h2; i64 rest = idx / h2;
        int j = rest % J; i64 n = rest / J;
        int t = n % T, b = n / T;
        act_t* dst = dqkv + n * J * D + j * D;
        const act_t* src;
        if (j < H) src = dq + (((i64)b * H + j) * T + t) * D;
        else if (j < H + K) src = dk + (((i64)b * K + (j - H)) * T + t) * D;
        else { src = dv + (((i64)b * K + (j - H - K)) * T + t) * D; dst[i] = src[i]; dst[i + h2] = src[i + h2]; continue; }
        float d1 = to_f(src[i]), d2 = to_f(src[i + h2]);
        float c = to_f(cosb[t * h2 + i]), s = to_f(sinb[t * h2 + i]);
        dst[i] = from_f(d1 * c + d2 * s);
        dst[i + h2] = from_f(d2 * c - d1 * s);
    }
}

extern "C" __global__ void qkv_rope_bwd_v2(const act_t* __restrict__ dq, const act_t* __restrict__ dk,
                                           const act_t* __restrict__ dv, const act_t* __restrict__ cosb,
                                           const act_t* __restrict__ sinb, act_t* __restrict__ dqkv,
                                           int B, int T, int H, int K, int D) {
    int h2 = D / 2, h4 = D / 4, J = H + 2 * K;
    i64 total = (i64)B * T * J * h4;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
        int i = (idx % h4) * 2; i64 rest = idx / h4;
        int j = rest % J; i64 n = rest / J;
        int t = n % T, b = n / T;
        act_t* dst = dqkv + n * J * D + j * D;
        const act_t* src;
        if (j < H) src = dq + (((i64)b * H + j) * T + t) * D;
        else if (j < H + K) src = dk + (((i64)b * K + (j - H)) * T + t) * D;
        else src = dv + (((i64)b * K + (j - H - K)) * T + t) * D;
        act2_t a = *reinterpret_cast<const act2_t*>(src + i), bb = *reinterpret_cast<const act2_t*>(src + i + h2);
        if (j >= H + K) {
            *reinterpret_cast<act2_t*>(dst + i) = a; *reinterpret_cast<act2_t*>(dst + i + h2) = bb;
            continue;
        }
        float2 d1 = to_f2(a), d2 = to_f2(bb);
        float2 c = to_f2(*reinterpret_cast<const act2_t*>(cosb + t * h2 + i));
        float2 s = to_f2(*reinterpret_cast<const act2_t*>(sinb + t * h2 + i));
        *reinterpret_cast<act2_t*>(dst + i) = from_f2(d1.x * c.x + d2.x * s.x, d1.y * c.y + d2.y * s.y);
        *reinterpret_cast<act2_t*>(dst + i + h2) = from_f2(d2.x * c.x - d1.x * s.x, d2.y * c.y - d1.y * s.y);
    }
}

// 8 neighbouring i per thread (D % 16 == 0): 16-byte accesses. dir = +1 forward (rotate by the
// angle, qkv -> q, k, v), -1 backward (rotate by minus the angle, dq, dk, dv -> dqkv). Only the
// backward is launched: at D % 16 == 0 the forward is rope_qk_fwd_v8 below, which copies no v.
template <int DIR>
__device__ __forceinline__ void qkv_rope_v8_impl(const act_t* __restrict__ qkv, const act_t* __restrict__ cosb,
                                                 const act_t* __restrict__ sinb, act_t* __restrict__ q,
                                                 act_t* __restrict__ k, act_t* __restrict__ v,
                                                 int B, int T, int H, int K, int D) {
    int h2 = D / 2, h8 = D / 16, J = H + 2 * K;
    i64 total = (i64)B * T * J * h8;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
        int i = (idx % h8) * 8; i64 rest = idx / h8;
        int j = rest % J; i64 n = rest / J;
        int t = n % T, b = n / T;
        act_t* packed = const_cast<act_t*>(qkv) + n * J * D + j * D;
        act_t* head;
        if (j < H) head = q + (((i64)b * H + j) * T + t) * D;
        else if (j < H + K) head = k + (((i64)b * K + (j - H)) * T + t) * D;
        else head = v + (((i64)b * K + (j - H - K)) * T + t) * D;
        const act_t* src = DIR > 0 ? packed : head;
        act_t* dst = DIR > 0 ? head : packed;
        vec8 a = *reinterpret_cast<const vec8*>(src + i), c2 = *reinterpret_cast<const vec8*>(src + i + h2);
        if (j >= H + K) {
            *reinterpret_cast<vec8*>(dst + i) = a;
            *reinterpret_cast<vec8*>(dst + i + h2) = c2;
            continue;
        }
        float cs[8], sn[8];
        load_row<8>(cosb + t * h2, i, cs);
        load_row<8>(sinb + t * h2, i, sn);
        vec8 o1, o2;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float x1 = to_f(a.v[e]), x2 = to_f(c2.v[e]);
            float s = DIR > 0 ? sn[e] : -sn[e];
            o1.v[e] = from_f(x1 * cs[e] - x2 * s);
            o2.v[e] = from_f(x2 * cs[e] + x1 * s);
        }
        *reinterpret_cast<vec8*>(dst + i) = o1;
        *reinterpret_cast<vec8*>(dst + i + h2) = o2;
    }
}
extern "C" __global__ void qkv_rope_bwd_v8(const act_t* dq, const act_t* dk, const act_t* dv, const act_t* cosb,
                                           const act_t* sinb, act_t* dqkv, int B, int T, int H, int K, int D) {
    qkv_rope_v8_impl<-1>(dqkv, cosb, sinb, const_cast<act_t*>(dq), const_cast<act_t*>(dk),
                         const_cast<act_t*>(dv), B, T, H, K, D);
}

// Forward without the split copies: rotate the q and k heads of qkv (B*T, (H+2K)*D) into
// qk (B*T, (H+K)*D); v stays where it is (the caller views it in place). D % 16 == 0.
extern "C" __global__ void rope_qk_fwd_v8(const act_t* __restrict__ qkv, const act_t* __restrict__ cosb,
                                          const act_t* __restrict__ sinb, act_t* __restrict__ qk,
                                          int B, int T, int H, int K, int D) {
    int h2 = D / 2, h8 = D / 16, J = H + K;
    i64 total = (i64)B * T * J * h8;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
        int i = (idx % h8) * 8; i64 rest = idx / h8;
        int j = rest % J; i64 n = rest / J;
        int t = n % T;
        const act_t* src = qkv + n * (J + K) * D + j * D;
        act_t* dst = qk + n * J * D + j * D;
        vec8 a = *reinterpret_cast<const vec8*>(src + i), c2 = *reinterpret_cast<const vec8*>(src + i + h2);
        float cs[8], sn[8];
        load_row<8>(cosb + t * h2, i, cs);
        load_row<8>(sinb + t * h2, i, sn);
        vec8 o1, o2;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float x1 = to_f(a.v[e]), x2 = to_f(c2.v[e]);
            o1.v[e] = from_f(x1 * cs[e] - x2 * sn[e]);
            o2.v[e] = from_f(x2 * cs[e] + x1 * sn[e]);
        }
        *reinterpret_cast<vec8*>(dst + i) = o1;
        *reinterpret_cast<vec8*>(dst + i + h2) = o2;
    }
}

// Backward with dq in fp32 (the flash backward's accumulator, already scaled): dq (B, H, T, D)
// fp32, dk/dv (B, K, T, D) act -> dqkv (B*T, (H+2K)*D), rotating by minus the angle. D % 16 == 0.
extern "C" __global__ void qkv_rope_bwd_v8_f32q(const float* __restrict__ dq, const act_t* __restrict__ dk,
                                                const act_t* __restrict__ dv, const act_t* __restrict__ cosb,
                                                const act_t* __restrict__ sinb, act_t* __restrict__ dqkv,
                                                int B, int T, int H, int K, int D) {
    int h2 = D / 2, h8 = D / 16, J = H + 2 * K;
    i64 total = (i64)B * T * J * h8;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (i64)gridDim.x * blockDim.x) {
        int i = (idx % h8) * 8; i64 rest = idx / h8;
        int j = rest % J; i64 n = rest / J;
        int t = n % T, b = n / T;
        act_t* dst = dqkv + n * J * D + j * D;
        float x1[8], x2[8];
        if (j < H) {
            const float* src = dq + (((i64)b * H + j) * T + t) * D;
            float4 a0 = *reinterpret_cast<const float4*>(src + i), a1 = *reinterpret_cast<const float4*>(src + i + 4);
            float4 b0 = *reinterpret_cast<const float4*>(src + i + h2), b1 = *reinterpret_cast<const float4*>(src + i + h2 + 4);
            x1[0] = a0.x; x1[1] = a0.y; x1[2] = a0.z; x1[3] = a0.w; x1[4] = a1.x; x1[5] = a1.y; x1[6] = a1.z; x1[7] = a1.w;
            x2[0] = b0.x; x2[1] = b0.y; x2[2] = b0.z; x2[3] = b0.w; x2[4] = b1.x; x2[5] = b1.y; x2[6] = b1.z; x2[7] = b1.w;
        } else {
            const act_t* src = j < H + K ? dk + (((i64)b * K + (j - H)) * T + t) * D
                                         : dv + (((i64)b * K + (j - H - K)) * T + t) * D;
            if (j >= H + K) {
                *reinterpret_cast<vec8*>(dst + i) = *reinterpret_cast<const vec8*>(src + i);
                *reinterpret_cast<vec8*>(dst + i + h2) = *reinterpret_cast<const vec8*>(src + i + h2);
                continue;
            }
            load_row<8>(src, i, x1);
            load_row<8>(src, i + h2, x2);
        }
        float cs[8], sn[8];
        load_row<8>(cosb + t * h2, i, cs);
        load_row<8>(sinb + t * h2, i, sn);
        vec8 o1, o2;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            o1.v[e] = from_f(x1[e] * cs[e] + x2[e] * sn[e]);
            o2.v[e] = from_f(x2[e] * cs[e] - x1[e] * sn[e]);
        }
        *reinterpret_cast<vec8*>(dst + i) = o1;
        *reinterpret_cast<vec8*>(dst + i + h2) = o2;
    }
}

// out = a + b (the residual stream), 8 per thread when n % 8 == 0
extern "C" __global__ void add_v8(const act_t* __restrict__ a, const act_t* __restrict__ b,
                                  act_t* __restrict__ out, long long n8) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (i64)gridDim.x * blockDim.x) {
        vec8 x = reinterpret_cast<const vec8*>(a)[i], y = reinterpret_cast<const vec8*>(b)[i], z;
#pragma unroll
        for (int e = 0; e < 8; e++) z.v[e] = from_f(to_f(x.v[e]) + to_f(y.v[e]));
        reinterpret_cast<vec8*>(out)[i] = z;
    }
}

// ------------------------------------------------------------------------------------------------
// SwiGLU (swiglu_forward / swiglu_backward): h = [gate | up] (N, 2F), out = silu(gate) * up
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

// ------------------------------------------------------------------------------------------------
// softmax + cross-entropy (cross_entropy_forward / _backward). The forward keeps only the row
// log-sum-exp (fp32, N floats); the backward recomputes softmax from the logits.
extern "C" __global__ void ce_fwd(const act_t* __restrict__ logits, const int* __restrict__ targets,
                                  float* __restrict__ losses, float* __restrict__ lse, long long N, int V) {
    i64 row = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
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

// dlogits = (softmax - onehot) * dlosses
extern "C" __global__ void ce_bwd(const act_t* __restrict__ logits, const int* __restrict__ targets,
                                  const float* __restrict__ lse, const float* __restrict__ dlosses,
                                  act_t* __restrict__ dlogits, long long N, int V) {
    i64 total = N * V;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        i64 n = i / V; int c = i % V;
        float p = __expf(to_f(logits[i]) - lse[n]);
        float d = dlosses[n];
        dlogits[i] = from_f((p - (c == targets[n] ? 1.f : 0.f)) * d);
    }
}

// ------------------------------------------------------------------------------------------------
// flat-buffer kernels: cast, sum of squares (global norm), AdamW

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

// partial[block] = sum of squares over a grid-stride slice (float, deterministic for a fixed grid)
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
