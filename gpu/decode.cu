// Decoding kernels: one new token per sequence per step, over a KV cache (generation).
//
// Batch-B decoding is memory bound (B << the weights' width), so every product here is a warp-per-
// output dot product over weights stored TRANSPOSED, (out, in) row-major: a warp reads one
// contiguous row with 16-byte loads and reduces with shuffles. No atomics in the products: each
// output is owned by one warp, so results are deterministic. The residual stream x is fp32 (B, C);
// q, the attention output and the SwiGLU output are fp32; the KV cache holds act_t.
//
// One step (captured once as a CUDA graph and replayed; nothing in it depends on the host):
//   dec_sample      logits -> ids, out[:, t]             (sampling on the device, see below)
//   per layer:
//     dec_qkv       [embedding (layer 0)] + RMSNorm + qkv products + RoPE; q -> fp32 buffer,
//                   k, v appended to the cache at pos
//     dec_attn      split-KV attention over cache[0..pos]; the last split block to finish (an
//                   atomic ticket per (b, h)) merges the splits in a fixed order -> att (B, H*D)
//     dec_proj      x += att @ wo                       (residual, in place)
//     dec_gateup    RMSNorm + gate/up products + SwiGLU -> s (B, F)
//     dec_proj      x += s @ w_down
//   dec_head        RMSNorm + LM head -> logits (B, V) fp32; pos += 1, t += 1
//
// state (int[4] on the device): [0] pos, the cache row this step writes; [1] t, steps done in
// this segment (the column of `out` the sampler writes).
//
// What a kernel before wrote (state, ids, the residual stream x, a product's input, the logits) must
// not be read by read-only loads (ld.global.nc, which the compiler makes of `const __restrict__`
// pointers): under PDL a kernel starts before the one it waits for has finished, and the read-only
// path is only promised for data that does not change while the kernel runs, so it may serve a
// value from before the last write (the sampler read a stale t that way in a graph of four steps on
// an H100). Plain loads after PDL_WAIT see those writes. So those pointers carry no __restrict__;
// weights, tables and the byte mask keep it. (The attention's q and cache pointers keep theirs: its
// PTX has no read-only load after the wait; checked with NVRTC 12.9 in the thirty-first session.)
//
// Shapes: B batch, C d_model, H heads, K kv heads, D head dim, F d_ff, V vocab, S cache length.
#include "common.cuh"

// Programmatic dependent launch (compute capability 9.0+, ops/cuda_launch.py): every kernel here lets
// the next one start at once (PDL_LAUNCH) and does what needs nothing from the kernel before it
// (reading its weight rows) before PDL_WAIT, which holds it until that kernel has finished and its
// writes are visible. Launched the ordinary way, PDL_WAIT returns at once: the same kernels serve
// both launches, with the same arithmetic.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_WAIT()
#define PDL_LAUNCH()
#endif

#define DEC_WARPS 8
#define DEC_THREADS (DEC_WARPS * 32)
#define FULL 0xffffffffu

// Loads of what other blocks of the same grid wrote (CG: the persistent step below, where the
// phases are one kernel): through L2, never a stale line of this SM's L1 or the read-only path.
// Without CG the ordinary load, for the kernels that only read what earlier kernels wrote.
template <bool CG> __device__ __forceinline__ float ldf(const float* p) {
    if constexpr (CG) return __ldcg(p); else return *p;
}
template <bool CG> __device__ __forceinline__ vec8 ld8(const act_t* p) {
    if constexpr (CG) {
        vec8 r;
        const uint4* src = reinterpret_cast<const uint4*>(p);
        uint4* dst = reinterpret_cast<uint4*>(&r);
#pragma unroll
        for (int i = 0; i < (int)(sizeof(vec8) / 16); i++) dst[i] = __ldcg(src + i);
        return r;
    } else {
        return *reinterpret_cast<const vec8*>(p);
    }
}

// Stage rows b0 .. b0+nb-1 of the input into shared memory xs (nb, Cin) fp32: from x (fp32), or
// from the embedding wte[ids] (layer 0, also written to xw by block 0), then RMSNorm with gain g
// when g is given: xs = x * (1 / sqrt(mean(x^2) + eps)) * g (the NumPy reference's order).
template <int R, bool CG = false>
__device__ void stage_rows(float* xs, const float* x, const act_t* __restrict__ wte,
                           const int* ids, float* xw, int b0, int nb, int Cin,
                           const act_t* __restrict__ g, float eps) {
    __shared__ float rs[R];
    for (int i = threadIdx.x; i < nb * Cin; i += blockDim.x) {
        int r = i / Cin, c = i - r * Cin;
        float v;
        if (ids) {
            v = to_f(wte[(i64)ids[b0 + r] * Cin + c]);
            if (xw) xw[(i64)(b0 + r) * Cin + c] = v;
        } else {
            v = ldf<CG>(x + (i64)(b0 + r) * Cin + c);
        }
        xs[i] = v;
    }
    __syncthreads();
    if (g) {
        int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        for (int r = warp; r < nb; r += DEC_WARPS) {
            float s = 0.f;
            for (int c = lane; c < Cin; c += 32) { float v = xs[r * Cin + c]; s += v * v; }
            s = warp_sum(s);
            if (lane == 0) rs[r] = 1.0f / sqrtf(s / (float)Cin + eps);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < nb * Cin; i += blockDim.x) {
            int r = i / Cin, c = i - r * Cin;
            xs[i] = __fmul_rn(__fmul_rn(xs[i], rs[r]), to_f(g[c]));
        }
        __syncthreads();
    }
}

// A warp's weight row, read before the inputs are staged (so the DRAM latency of the weights
// overlaps the staging and the RMSNorm): chunk k of lane l is columns l*8 + 256*k; the first NCH
// chunks live in registers, any further ones (Cin > 256 * NCH) are read in the product loop.
#define NCH 4
__device__ __forceinline__ void fetch_row(const act_t* __restrict__ w, int Cin, vec8* wr) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < NCH; k++) {
        int c = lane * 8 + k * 256;
        if (c < Cin) wr[k] = *reinterpret_cast<const vec8*>(w + c);
    }
}

__device__ __forceinline__ float dot8(const vec8& w, const float* x, float s) {
    const float4* xp = reinterpret_cast<const float4*>(x);
    float4 a = xp[0], b = xp[1];
    s = fmaf(to_f(w.v[0]), a.x, s); s = fmaf(to_f(w.v[1]), a.y, s);
    s = fmaf(to_f(w.v[2]), a.z, s); s = fmaf(to_f(w.v[3]), a.w, s);
    s = fmaf(to_f(w.v[4]), b.x, s); s = fmaf(to_f(w.v[5]), b.y, s);
    s = fmaf(to_f(w.v[6]), b.z, s); s = fmaf(to_f(w.v[7]), b.w, s);
    return s;
}

// acc[r] = w . xs[r] over Cin (one warp; Cin % 8 == 0, w 16-byte aligned), warp-reduced;
// wr holds the row's first NCH chunks (fetch_row)
template <int R>
__device__ __forceinline__ void warp_dot(const act_t* __restrict__ w, const vec8* wr, const float* xs, int Cin,
                                         int nb, float* acc) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.f;
#pragma unroll
    for (int k = 0; k < NCH; k++) {
        int c = lane * 8 + k * 256;
        if (c < Cin) {
#pragma unroll
            for (int r = 0; r < R; r++) if (r < nb) acc[r] = dot8(wr[k], xs + r * Cin + c, acc[r]);
        }
    }
    for (int c = lane * 8 + NCH * 256; c < Cin; c += 256) {
        vec8 wv = *reinterpret_cast<const vec8*>(w + c);
#pragma unroll
        for (int r = 0; r < R; r++) if (r < nb) acc[r] = dot8(wv, xs + r * Cin + c, acc[r]);
    }
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
}

// The qkv products' stores, shared by the warp and the tensor-core kernels: a q/k RoPE pair
// (u1 at i, u2 at i + D/2) rotated at pos into q (fp32) or the key cache, or two v outputs (u1 at
// i, u2 at i + vstep) into the value cache.
__device__ __forceinline__ void qkv_store(float u1, float u2, bool rot, int head, int i, int vstep, int b, int pos,
                                          const float* __restrict__ cosb, const float* __restrict__ sinb,
                                          float* __restrict__ q, act_t* __restrict__ kc, act_t* __restrict__ vc,
                                          int H, int K, int D, int S) {
    const int hd = D / 2;
    if (rot) {
        float cs = cosb[(i64)pos * hd + i], sn = sinb[(i64)pos * hd + i];
        float o1 = __fsub_rn(__fmul_rn(u1, cs), __fmul_rn(u2, sn));
        float o2 = __fadd_rn(__fmul_rn(u2, cs), __fmul_rn(u1, sn));
        if (head < H) {
            float* qp = q + ((i64)b * H + head) * D;
            qp[i] = o1; qp[i + hd] = o2;
        } else {
            act_t* kp = kc + (((i64)b * K + (head - H)) * S + pos) * D;
            kp[i] = from_f(o1); kp[i + hd] = from_f(o2);
        }
    } else {
        act_t* vp = vc + (((i64)b * K + head) * S + pos) * D;
        vp[i] = from_f(u1); vp[i + vstep] = from_f(u2);
    }
}

// The two qkv weight rows of a thread's pair, and the head and index within it that qkv_store
// takes: RoPE pair p (rot: p < (H + K) * D / 2; rows i and i + D/2 of a q or k head) or v outputs
// p and p + vstep (rows (H + K) * D + p and + vstep).
__device__ __forceinline__ void qkv_rows(bool rot, int p, int vstep, int H, int K, int D, int& head, int& i,
                                         int& ra, int& rb) {
    const int hd = D / 2;
    if (rot) {
        head = p / hd; i = p - head * hd;
        ra = head * D + i; rb = ra + hd;
    } else {
        head = p / D; i = p - head * D;
        ra = (H + K) * D + p; rb = ra + vstep;
    }
}

// SwiGLU of one gate/up pair: silu(ga) * up
__device__ __forceinline__ float swiglu1(float ga, float up) {
    float sig = 1.0f / (1.0f + expf(-ga));
    return __fmul_rn(__fmul_rn(ga, sig), up);
}

// ------------------------------------------------------------------------------------------------
// qkv: x (B, C) [or wte[ids]] -> RMSNorm(g) -> wt ((H+2K)D, C) -> RoPE(q, k) at pos;
// q -> (B, H, D) fp32, k/v -> cache (B, K, S, D) row pos. A warp item is a pair of outputs:
// (i, i + D/2) of a q or k head (rotated together), or two adjacent v outputs.
template <int R>
__device__ void dec_qkv_impl(const float* x, float* xw, const int* ids,
                             const act_t* __restrict__ wte, const act_t* __restrict__ g,
                             const act_t* __restrict__ wt, const float* __restrict__ cosb,
                             const float* __restrict__ sinb, float* __restrict__ q, act_t* __restrict__ kc,
                             act_t* __restrict__ vc, const int* state, int B, int C, int H,
                             int K, int D, int S, float eps) {
    extern __shared__ float xs[];
    PDL_LAUNCH();
    const int hd = D / 2;
    const int n_rot = (H + K) * hd, n_items = (H + 2 * K) * hd;
    const int item = blockIdx.x * DEC_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    int j1, j2, head, i;
    if (item < n_rot) qkv_rows(true, item, 1, H, K, D, head, i, j1, j2);
    else qkv_rows(false, 2 * (item - n_rot), 1, H, K, D, head, i, j1, j2);   // v output index, even
    vec8 w1[NCH], w2[NCH];
    if (item < n_items) { fetch_row(wt + (i64)j1 * C, C, w1); fetch_row(wt + (i64)j2 * C, C, w2); }
    PDL_WAIT();                                   // x, ids, the cache and pos: the kernels before
    const int pos = state[0];
    for (int b0 = 0; b0 < B; b0 += R) {
        int nb = min(R, B - b0);
        stage_rows<R>(xs, x, wte, ids, blockIdx.x == 0 ? xw : nullptr, b0, nb, C, g, eps);
        if (item < n_items) {
            float a1[R], a2[R];
            warp_dot<R>(wt + (i64)j1 * C, w1, xs, C, nb, a1);
            warp_dot<R>(wt + (i64)j2 * C, w2, xs, C, nb, a2);
            if (lane < nb) {
                float u1 = 0.f, u2 = 0.f;
#pragma unroll
                for (int r = 0; r < R; r++) if (r == lane) { u1 = a1[r]; u2 = a2[r]; }
                qkv_store(u1, u2, item < n_rot, head, i, 1, b0 + lane, pos, cosb, sinb, q, kc, vc, H, K, D, S);
            }
        }
        __syncthreads();
    }
}

// ------------------------------------------------------------------------------------------------
// out[b, o] (+)= in[b] . wt[o]: the projections that add into the residual stream (wo, w_down)
// (accumulate = 1) and the LM head (accumulate = 0, RMSNorm(g) on the way in; bumps pos and t).
template <int R>
__device__ void dec_proj_impl(const float* in, const act_t* __restrict__ wt, float* out,
                              const act_t* __restrict__ g, int B, int Cin, int Cout, int accumulate,
                              float eps, int* state) {
    extern __shared__ float xs[];
    const int o = blockIdx.x * DEC_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    PDL_LAUNCH();
    vec8 wr[NCH];
    if (o < Cout) fetch_row(wt + (i64)o * Cin, Cin, wr);
    PDL_WAIT();
    for (int b0 = 0; b0 < B; b0 += R) {
        int nb = min(R, B - b0);
        stage_rows<R>(xs, in, nullptr, nullptr, nullptr, b0, nb, Cin, g, eps);
        if (o < Cout) {
            float acc[R];
            warp_dot<R>(wt + (i64)o * Cin, wr, xs, Cin, nb, acc);
            if (lane < nb) {
                float a = 0.f;
#pragma unroll
                for (int r = 0; r < R; r++) if (r == lane) a = acc[r];
                float* p = out + (i64)(b0 + lane) * Cout + o;
                *p = accumulate ? __fadd_rn(*p, a) : a;
            }
        }
        __syncthreads();
    }
    if (state && blockIdx.x == 0 && threadIdx.x == 0) { state[0] += 1; state[1] += 1; }
}

// gate/up + SwiGLU: s[b, j] = silu(gate_j) * up_j, gate_j = RMSNorm(x) . wt[j], up_j = . wt[F + j]
template <int R>
__device__ void dec_gateup_impl(const float* x, const act_t* __restrict__ g,
                                const act_t* __restrict__ wt, float* __restrict__ s, int B, int C, int F,
                                float eps) {
    extern __shared__ float xs[];
    const int j = blockIdx.x * DEC_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    PDL_LAUNCH();
    vec8 w1[NCH], w2[NCH];
    if (j < F) { fetch_row(wt + (i64)j * C, C, w1); fetch_row(wt + (i64)(F + j) * C, C, w2); }
    PDL_WAIT();
    for (int b0 = 0; b0 < B; b0 += R) {
        int nb = min(R, B - b0);
        stage_rows<R>(xs, x, nullptr, nullptr, nullptr, b0, nb, C, g, eps);
        if (j < F) {
            float a1[R], a2[R];
            warp_dot<R>(wt + (i64)j * C, w1, xs, C, nb, a1);
            warp_dot<R>(wt + (i64)(F + j) * C, w2, xs, C, nb, a2);
            if (lane < nb) {
                float ga = 0.f, up = 0.f;
#pragma unroll
                for (int r = 0; r < R; r++) if (r == lane) { ga = a1[r]; up = a2[r]; }
                s[(i64)(b0 + lane) * F + j] = swiglu1(ga, up);
            }
        }
        __syncthreads();
    }
}

#define DEC_GEMV_KERNELS(R)                                                                          \
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 2) dec_qkv_r##R(                             \
        const float* x, float* xw, const int* ids, const act_t* wte, const act_t* g, const act_t* wt,  \
        const float* cosb, const float* sinb, float* q, act_t* kc, act_t* vc, const int* state,       \
        int B, int C, int H, int K, int D, int S, float eps) {                                        \
    dec_qkv_impl<R>(x, xw, ids, wte, g, wt, cosb, sinb, q, kc, vc, state, B, C, H, K, D, S, eps);    \
}                                                                                                     \
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 2) dec_proj_r##R(                            \
        const float* in, const act_t* wt, float* out, const act_t* g, int B, int Cin, int Cout,       \
        int accumulate, float eps, int* state) {                                                      \
    dec_proj_impl<R>(in, wt, out, g, B, Cin, Cout, accumulate, eps, state);                           \
}                                                                                                     \
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 2) dec_gateup_r##R(                          \
        const float* x, const act_t* g, const act_t* wt, float* s, int B, int C, int F, float eps) {  \
    dec_gateup_impl<R>(x, g, wt, s, B, C, F, eps);                                                    \
}
#ifndef DEC_STEP_R
DEC_GEMV_KERNELS(1)
DEC_GEMV_KERNELS(2)
DEC_GEMV_KERNELS(4)
DEC_GEMV_KERNELS(8)
#endif

#if HAS_MMA
// ------------------------------------------------------------------------------------------------
// The same three products on tensor cores, for batches where the warp-per-output kernels above
// grow with B (each weight times B staged rows from shared memory) and the captured cuBLAS step
// is ~200 launches (ops/cuda_decode.py, MMA_MAX_BATCH). out (B, O) = in (B, Cin) Wt (O, Cin)^T
// as mma.sync m16n8k16 with A = 16 weight rows (a CTA's row map: 16 rows, or 8 pairs whose two
// halves land in one thread: rows g and g + 8 of the C fragment), B = 8 batch rows of the input,
// staged in shared memory as act_t (so the input is rounded to act_t, as the cuBLAS step's is),
// NT x 8 rows at a time. The 8 warps of a CTA split Cin: warp w takes 32-column chunks w, w + 8,
// ...; their partial tiles are summed in warp order (fixed: deterministic) and warp 0 writes.
// Cin % 32 == 0, Cin <= 2048 (MC chunks a warp, read before PDL_WAIT).
//
// Within a 32-column chunk the k order is permuted the same way for A and B (a dot product does
// not depend on it): thread t reads columns 8t .. 8t+7 of its two rows as one 16-byte load; step
// s (0, 1) of the chunk uses columns 8t + 4s .. 8t + 4s + 3 as logical k (2t, 2t+1, 2t+8, 2t+9),
// so a0 = row g, a1 = row g + 8 (cols 8t+4s, +1), a2, a3 the same rows (cols 8t+4s+2, +3), and
// b0 / b1 = batch row g of the tile at those column pairs. C: c0,c1 (row g, batch 2t, 2t+1),
// c2,c3 (row g + 8, the same batch rows).
#define MC 8
#define XPAD 8                                    // act_t elements of padding per staged row

// stage batch rows b0 .. b0 + NB - 1 (rows past B zero) of the input into xh (NB, Cin + XPAD)
// act_t: from x (fp32) or wte[ids] (also written to xw by block 0), RMSNorm(g) when g is given
// (the reference's order: (x * rs) * g, then rounded to act_t)
__device__ void stage_h(act_t* xh, const float* x, const act_t* __restrict__ wte,
                        const int* ids, float* xw, int B, int b0, int NB, int Cin,
                        const act_t* __restrict__ g, float eps) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, ld = Cin + XPAD;
    for (int r = warp; r < NB; r += DEC_WARPS) {
        const int b = b0 + r;
        act_t* row = xh + (i64)r * ld;
        if (b >= B) {
            for (int c = lane; c < Cin; c += 32) row[c] = from_f(0.f);
            continue;
        }
        float rs = 1.f;
        if (g) {
            float ss = 0.f;
            for (int c = lane; c < Cin; c += 32) {
                float v = ids ? to_f(wte[(i64)ids[b] * Cin + c]) : x[(i64)b * Cin + c];
                ss += v * v;
            }
            ss = warp_sum(ss);
            rs = 1.0f / sqrtf(ss / (float)Cin + eps);
        }
        for (int c = lane; c < Cin; c += 32) {
            float v = ids ? to_f(wte[(i64)ids[b] * Cin + c]) : x[(i64)b * Cin + c];
            if (ids && xw && blockIdx.x == 0) xw[(i64)b * Cin + c] = v;
            row[c] = from_f(g ? __fmul_rn(__fmul_rn(v, rs), to_f(g[c])) : v);
        }
    }
}

// this warp's chunks of rows ra and rb (one thread: row g and row g + 8 of the tile)
__device__ __forceinline__ void fetch_chunks(const act_t* __restrict__ wt, int ra, int rb, int Cin,
                                             uint4* wa, uint4* wb) {
    const int warp = threadIdx.x >> 5, t = threadIdx.x & 3, nk = Cin / 32;
#pragma unroll
    for (int k = 0; k < MC; k++) {
        int c = (warp + k * DEC_WARPS) * 32 + 8 * t;
        if (warp + k * DEC_WARPS < nk) {
            wa[k] = *reinterpret_cast<const uint4*>(wt + (i64)ra * Cin + c);
            wb[k] = *reinterpret_cast<const uint4*>(wt + (i64)rb * Cin + c);
        }
    }
}

// acc (warp 0, after the call): the CTA's 16 x (NT * 8) tile, summed over the warps in order;
// red: DEC_WARPS * 32 * NT * 4 floats of shared memory
template <int NT>
__device__ void mma_tile(const uint4* wa, const uint4* wb, const act_t* xh, int Cin, float* red,
                         float acc[NT][4]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int nk = Cin / 32, ld = Cin + XPAD;
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
    for (int k = 0; k < MC; k++) {
        const int ck = warp + k * DEC_WARPS;
        if (ck < nk) {
            const u32* pa = reinterpret_cast<const u32*>(&wa[k]);
            const u32* pb = reinterpret_cast<const u32*>(&wb[k]);
#pragma unroll
            for (int s = 0; s < 2; s++) {
                u32 a[4] = {pa[2 * s], pb[2 * s], pa[2 * s + 1], pb[2 * s + 1]};
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const uint2 bv = *reinterpret_cast<const uint2*>(xh + (i64)(j * 8 + g) * ld + ck * 32 + 8 * t + 4 * s);
                    mma16816(acc[j], a, bv.x, bv.y);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) red[((warp * 32 + lane) * NT + j) * 4 + e] = acc[j][e];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = red[(lane * NT + j) * 4 + e];
                for (int w = 1; w < DEC_WARPS; w++) v = __fadd_rn(v, red[((w * 32 + lane) * NT + j) * 4 + e]);
                acc[j][e] = v;
            }
    }
    __syncthreads();
}

// The loop every tensor-core product shares: this thread's rows ra and rb (the tile's rows g and
// g + 8) read before PDL_WAIT, then for each NT x 8 batch rows: stage the input (stage_h's
// arguments), the tile, and store(b, value of row ra, value of row rb) for each batch row b < B
// this thread holds (warp 0 only).
template <int NT, class Store>
__device__ __forceinline__ void mma_rows(const act_t* __restrict__ wt, int ra, int rb, int Cin, int B,
                                         const float* __restrict__ x, const act_t* __restrict__ wte,
                                         const int* __restrict__ ids, float* xw, const act_t* __restrict__ gn,
                                         float eps, Store store) {
    extern __shared__ float smem[];
    PDL_LAUNCH();
    uint4 wa[MC], wb[MC];
    fetch_chunks(wt, ra, rb, Cin, wa, wb);
    PDL_WAIT();                                   // the input, the cache and pos: the kernels before
    const int NB = NT * 8, t = threadIdx.x & 3;
    act_t* xh = reinterpret_cast<act_t*>(smem);
    float* red = smem + (NB * (Cin + XPAD) + 1) / 2;
    for (int b0 = 0; b0 < B; b0 += NB) {
        stage_h(xh, x, wte, ids, xw, B, b0, NB, Cin, gn, eps);
        __syncthreads();
        float acc[NT][4];
        mma_tile<NT>(wa, wb, xh, Cin, red, acc);
        if ((threadIdx.x >> 5) == 0) {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int b = b0 + j * 8 + 2 * t + e;
                    if (b < B) store(b, acc[j][e], acc[j][2 + e]);
                }
        }
        __syncthreads();
    }
}

// qkv on tensor cores: CTA i < (H + K) * D / 16 owns 8 RoPE pairs (i0 + g, i0 + g + D/2) of a q or
// k head; the next K * D / 16 CTAs own 16 consecutive v outputs (rows g and g + 8: outputs i and
// i + 8 of one head, D % 16 == 0)
template <int NT>
__device__ void dec_qkv_mma_impl(const float* x, float* xw, const int* ids,
                                 const act_t* __restrict__ wte, const act_t* __restrict__ gn,
                                 const act_t* __restrict__ wt, const float* __restrict__ cosb,
                                 const float* __restrict__ sinb, float* __restrict__ q, act_t* __restrict__ kc,
                                 act_t* __restrict__ vc, const int* state, int B, int C, int H,
                                 int K, int D, int S, float eps) {
    const int g = (threadIdx.x & 31) >> 2, n_rot = (H + K) * D / 16;
    const bool rot = (int)blockIdx.x < n_rot;
    int head, i, ra, rb;                          // pair 8 blockIdx + g (hd % 8 == 0: one head a CTA)
    qkv_rows(rot, rot ? blockIdx.x * 8 + g : (blockIdx.x - n_rot) * 16 + g, 8, H, K, D, head, i, ra, rb);
    mma_rows<NT>(wt, ra, rb, C, B, x, wte, ids, xw, gn, eps, [&](int b, float u1, float u2) {
        qkv_store(u1, u2, rot, head, i, 8, b, state[0], cosb, sinb, q, kc, vc, H, K, D, S);
    });
}

// out (+)= in . wt on tensor cores (wo, w_down; the LM head with RMSNorm(g), bumping pos and t):
// CTA i owns output rows 16 i + g and 16 i + g + 8 (rows past Cout read row Cout - 1, never written)
template <int NT>
__device__ void dec_proj_mma_impl(const float* in, const act_t* __restrict__ wt, float* out,
                                  const act_t* __restrict__ gn, int B, int Cin, int Cout, int accumulate,
                                  float eps, int* state) {
    const int oa = blockIdx.x * 16 + ((threadIdx.x & 31) >> 2), ob = oa + 8;
    mma_rows<NT>(wt, min(oa, Cout - 1), min(ob, Cout - 1), Cin, B, in, nullptr, nullptr, nullptr, gn, eps,
                 [&](int b, float ua, float ub) {
        const int o2[2] = {oa, ob};
        const float u[2] = {ua, ub};
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (o2[r] >= Cout) continue;
            float* p = out + (i64)b * Cout + o2[r];
            *p = accumulate ? __fadd_rn(*p, u[r]) : u[r];
        }
    });
    if (state && blockIdx.x == 0 && threadIdx.x == 0) { state[0] += 1; state[1] += 1; }
}

// gate/up + SwiGLU on tensor cores: CTA i owns j = 8 i + g (gate row j, up row F + j)
template <int NT>
__device__ void dec_gateup_mma_impl(const float* x, const act_t* __restrict__ gn,
                                    const act_t* __restrict__ wt, float* __restrict__ s, int B, int C, int F,
                                    float eps) {
    const int j = blockIdx.x * 8 + ((threadIdx.x & 31) >> 2), jr = min(j, F - 1);
    mma_rows<NT>(wt, jr, F + jr, C, B, x, nullptr, nullptr, nullptr, gn, eps, [&](int b, float ga, float up) {
        if (j < F) s[(i64)b * F + j] = swiglu1(ga, up);
    });
}

#define DEC_MMA_KERNELS(NT)                                                                          \
extern "C" __global__ void __launch_bounds__(DEC_THREADS) dec_qkv_m##NT(                              \
        const float* x, float* xw, const int* ids, const act_t* wte, const act_t* g, const act_t* wt,  \
        const float* cosb, const float* sinb, float* q, act_t* kc, act_t* vc, const int* state,       \
        int B, int C, int H, int K, int D, int S, float eps) {                                        \
    dec_qkv_mma_impl<NT>(x, xw, ids, wte, g, wt, cosb, sinb, q, kc, vc, state, B, C, H, K, D, S, eps); \
}                                                                                                     \
extern "C" __global__ void __launch_bounds__(DEC_THREADS) dec_proj_m##NT(                             \
        const float* in, const act_t* wt, float* out, const act_t* g, int B, int Cin, int Cout,       \
        int accumulate, float eps, int* state) {                                                      \
    dec_proj_mma_impl<NT>(in, wt, out, g, B, Cin, Cout, accumulate, eps, state);                      \
}                                                                                                     \
extern "C" __global__ void __launch_bounds__(DEC_THREADS) dec_gateup_m##NT(                           \
        const float* x, const act_t* g, const act_t* wt, float* s, int B, int C, int F, float eps) {  \
    dec_gateup_mma_impl<NT>(x, g, wt, s, B, C, F, eps);                                               \
}
#ifndef DEC_STEP_R
DEC_MMA_KERNELS(1)
DEC_MMA_KERNELS(2)
DEC_MMA_KERNELS(4)
#endif
#endif

// ------------------------------------------------------------------------------------------------
// Attention of one new query per (b, h) over cache keys 0..pos (pos = state[0], the row dec_qkv
// just wrote), split over gridDim.y blocks of CH keys each. 4 warps; a key is read by LK = D/8
// lanes (16 bytes each), so a warp takes KW = 32/LK keys at a time, U of them per iteration.
// Online softmax in base 2 (scale * log2(e) folded into q). Each block leaves (O, m, l) for its
// split in `part`; the last block of a (b, h) to finish (atomic ticket) merges the splits in split
// order (deterministic) and writes att[b, h*D:(h+1)*D] = O / l, then resets the ticket.
// ACT (the captured cuBLAS step's variant, dec_attn_act_d*): the query read as act_t where the
// projection left it (element strides qsb per sequence, qsh per head) and the output written as
// act_t (from_f, the rounding of the cast it replaces); the same arithmetic otherwise.
// one (b, h, split) block's shared memory: NW * KW = 1024 / D groups of D partial outputs
template <int D> struct AttnShared { float m[1024 / D], l[1024 / D], o[1024]; int last; };

// The attention of one block of 128 threads (tid), (b, h) = bh, split sp of NS, its shared memory
// sh and its barrier sync() (__syncthreads in dec_attn_d*, a named barrier for half a block in the
// persistent step); CG: q and the cache read through L2 (the persistent step wrote them).
template <int D, bool ACT, bool CG, class Sync>
__device__ void dec_attn_core(int tid, int bh, int sp, int NS, AttnShared<D>& sh, Sync sync,
                              const float* q, const act_t* qa, i64 qsb, i64 qsh,
                              const act_t* kc, const act_t* vc, float* part,
                              int* tickets, float* att, act_t* atta,
                              const int* state, int H, int K, int S, int CH, float scale_log2) {
    constexpr int LK = D / 8, KW = 32 / LK, NW = 4, U = 4;
    constexpr int STEP = NW * KW;
    static_assert(NW * KW == 1024 / D, "AttnShared's size");
    const int b = bh / H, h = bh - b * H;
    const int kh = h / (H / K);
    const int n = state[0] + 1;
    const int k0 = sp * CH, k1 = min(n, k0 + CH);
    const int warp = tid >> 5, lane = tid & 31;
    const int grp = lane / LK, sub = lane - grp * LK;
    float qf[8];
    if constexpr (ACT) {
        const act_t* qp = qa + (i64)b * qsb + (i64)h * qsh + sub * 8;
#pragma unroll
        for (int i = 0; i < 8; i++) qf[i] = to_f(qp[i]) * scale_log2;
    } else {
        const float* qp = q + (i64)bh * D + sub * 8;
#pragma unroll
        for (int i = 0; i < 8; i++) qf[i] = ldf<CG>(qp + i) * scale_log2;
    }
    const act_t* kb = kc + ((i64)b * K + kh) * S * D + sub * 8;
    const act_t* vb = vc + ((i64)b * K + kh) * S * D + sub * 8;
    float m = -INFINITY, l = 0.f, o[8];
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = 0.f;
    for (int w0 = k0 + warp * KW; w0 < k1; w0 += STEP * U) {      // warp-uniform trip count
        vec8 kv[U], vv[U];
        float sc[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int key = w0 + grp + u * STEP;
            if (key < k1) {
                kv[u] = ld8<CG>(kb + (i64)key * D);
                vv[u] = ld8<CG>(vb + (i64)key * D);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int key = w0 + grp + u * STEP;
            float d = 0.f;
            if (key < k1) {
#pragma unroll
                for (int i = 0; i < 8; i++) d = fmaf(qf[i], to_f(kv[u].v[i]), d);
            }
#pragma unroll
            for (int off = LK / 2; off > 0; off >>= 1) d += __shfl_xor_sync(FULL, d, off);
            sc[u] = key < k1 ? d : -INFINITY;
        }
        float mx = m;
#pragma unroll
        for (int u = 0; u < U; u++) mx = fmaxf(mx, sc[u]);
        if (mx > -INFINITY) {
            float corr = exp2f(m - mx);
            l *= corr;
#pragma unroll
            for (int i = 0; i < 8; i++) o[i] *= corr;
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (sc[u] > -INFINITY) {
                    float p = exp2f(sc[u] - mx);
                    l += p;
#pragma unroll
                    for (int i = 0; i < 8; i++) o[i] = fmaf(p, to_f(vv[u].v[i]), o[i]);
                }
            }
            m = mx;
        }
    }
    const int gi = warp * KW + grp;
    if (sub == 0) { sh.m[gi] = m; sh.l[gi] = l; }
#pragma unroll
    for (int i = 0; i < 8; i++) sh.o[gi * D + sub * 8 + i] = o[i];
    sync();
    float* pp = part + ((i64)bh * NS + sp) * (D + 2);
    for (int t = tid; t < D; t += 128) {
        float M = -INFINITY;
        for (int gg = 0; gg < NW * KW; gg++) M = fmaxf(M, sh.m[gg]);
        float L = 0.f, O = 0.f;
        if (M > -INFINITY) {
            for (int gg = 0; gg < NW * KW; gg++) {
                if (sh.m[gg] > -INFINITY) {
                    float w = exp2f(sh.m[gg] - M);
                    L = fmaf(sh.l[gg], w, L);
                    O = fmaf(sh.o[gg * D + t], w, O);
                }
            }
        }
        if (NS == 1) {
            if constexpr (ACT) atta[(i64)bh * D + t] = from_f(O / L);
            else att[(i64)bh * D + t] = O / L;
        } else {
            __stcg(pp + t, O);
            if (t == 0) { __stcg(pp + D, M); __stcg(pp + D + 1, L); }
        }
    }
    if (NS == 1) return;
    __threadfence();
    sync();
    if (tid == 0) sh.last = atomicAdd(tickets + bh, 1) == NS - 1;
    sync();
    if (!sh.last) return;
    __threadfence();
    const float* pb = part + (i64)bh * NS * (D + 2);
    for (int t = tid; t < D; t += 128) {
        float M = -INFINITY;
        for (int s = 0; s < NS; s++) M = fmaxf(M, __ldcg(pb + s * (D + 2) + D));
        float L = 0.f, O = 0.f;
        for (int s = 0; s < NS; s++) {
            float ms = __ldcg(pb + s * (D + 2) + D);
            if (ms > -INFINITY) {
                float w = exp2f(ms - M);
                L = fmaf(__ldcg(pb + s * (D + 2) + D + 1), w, L);
                O = fmaf(__ldcg(pb + s * (D + 2) + t), w, O);
            }
        }
        if constexpr (ACT) atta[(i64)bh * D + t] = from_f(O / L);
        else att[(i64)bh * D + t] = O / L;
    }
    if (tid == 0) tickets[bh] = 0;
}

template <int D, bool ACT = false>
__device__ void dec_attn_impl(const float* q, const act_t* qa, i64 qsb, i64 qsh,
                              const act_t* kc, const act_t* vc, float* part,
                              int* tickets, float* att, act_t* atta,
                              const int* state, int H, int K, int S, int CH, float scale_log2) {
    __shared__ AttnShared<D> sh;
    PDL_LAUNCH();
    PDL_WAIT();                                   // q and the cache row just written
    dec_attn_core<D, ACT, false>(threadIdx.x, blockIdx.x, blockIdx.y, gridDim.y, sh, [] { __syncthreads(); },
                                 q, qa, qsb, qsh, kc, vc, part, tickets, att, atta, state, H, K, S, CH,
                                 scale_log2);
}

#define DEC_ATTN_KERNEL(D)                                                                            \
extern "C" __global__ void __launch_bounds__(128) dec_attn_d##D(                                    \
        const float* q, const act_t* kc, const act_t* vc, float* part, int* tickets, float* att,      \
        const int* state, int H, int K, int S, int CH, float scale_log2) {                            \
    dec_attn_impl<D>(q, nullptr, 0, 0, kc, vc, part, tickets, att, nullptr, state, H, K, S, CH, scale_log2); \
}
#ifndef DEC_STEP_R
DEC_ATTN_KERNEL(16)
DEC_ATTN_KERNEL(32)
DEC_ATTN_KERNEL(64)
DEC_ATTN_KERNEL(128)
DEC_ATTN_KERNEL(256)
#endif

#define DEC_ATTN_ACT_KERNEL(D)                                                                        \
extern "C" __global__ void __launch_bounds__(128) dec_attn_act_d##D(                                \
        const act_t* qa, long long qsb, long long qsh, const act_t* kc, const act_t* vc, float* part,  \
        int* tickets, act_t* att, const int* state, int H, int K, int S, int CH, float scale_log2) {  \
    dec_attn_impl<D, true>(nullptr, qa, qsb, qsh, kc, vc, part, tickets, nullptr, att, state, H, K, S, CH, \
                           scale_log2);                                                            \
}
#ifndef DEC_STEP_R
DEC_ATTN_ACT_KERNEL(16)
DEC_ATTN_ACT_KERNEL(32)
DEC_ATTN_ACT_KERNEL(64)
DEC_ATTN_ACT_KERNEL(128)
DEC_ATTN_ACT_KERNEL(256)
#endif

// ------------------------------------------------------------------------------------------------
// The whole model step as one persistent kernel, dec_step (ops/cuda_decode.py, PERSIST): the launches of the
// kernel path above (per layer dec_qkv, dec_attn, dec_proj (wo), dec_gateup, dec_proj (w_down); then
// the head) become phases of one grid, separated by grid-wide barriers instead of kernel boundaries.
// Each warp owns the same output (pair) in every product phase (item = block * 8 + warp) and reads
// its weight rows for the next phase before it waits at the barrier, as the PDL launches read them
// before griddepcontrol.wait. The arithmetic is the kernel path's, term for term (the same device
// functions, the same order), so the logits are the same bits; what other blocks wrote in this
// launch is read through L2 (CG). Conditions (the host checks them): one staging a phase (B <= R),
// one item a warp (the grid covers the widest product), two attention blocks of 128 threads a CTA
// cover B * H * NS, and every block resident at once (a cooperative launch, which refuses otherwise).
//
// The barrier: bar[0] counts arrivals and only grows (wrapping); bar[1] holds its value when the
// launch began (block 0 writes it at the end), so the k-th barrier waits for bar[1] + k * gridDim.x.
// lp: per layer 8 pointers: attn_norm, wqkv^T, wo^T, mlp_norm, w_gateup^T, w_down^T, key and value cache.
__device__ __forceinline__ void grid_arrive(unsigned int* bar) {   // after this block's stores
    __syncthreads();
    if (threadIdx.x == 0) {
        // the add releases this block's writes (ordered before it by the barrier above); a full
        // __threadfence then a relaxed add measured the same (H100, base fp16, batch 1: 2,827 / 2,868)
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(bar) : "memory");
    }
}
__device__ __forceinline__ void grid_wait(const unsigned int* bar, unsigned int& target) {
    target += gridDim.x;
    if (threadIdx.x == 0) {
        unsigned int v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
        } while ((int)(v - target) < 0);
    }
    __syncthreads();
}

// lane r's value of acc[r] (r < R), as the kernel path's stores pick it
template <int R> __device__ __forceinline__ float pick(const float* acc, int lane) {
    float a = 0.f;
#pragma unroll
    for (int r = 0; r < R; r++) if (r == lane) a = acc[r];
    return a;
}

// the persistent step's attention phase for block vb of 128 threads (half a CTA, named barrier id),
// (inlined: a call would save the registers live across it)
template <int D>
__device__ __forceinline__ void step_attn(int vb, int NS, AttnShared<D>& sh, unsigned int id, const float* q,
                                       const act_t* kc, const act_t* vc, float* part, int* tickets, float* att,
                                       const int* state, int H, int K, int S, int CH, float scale_log2) {
    dec_attn_core<D, false, true>(threadIdx.x & 127, vb / NS, vb % NS, NS, sh,
                                  [id] { asm volatile("bar.sync %0, 128;" :: "r"(id) : "memory"); },
                                  q, nullptr, 0, 0, kc, vc, part, tickets, att, nullptr, state, H, K, S, CH,
                                  scale_log2);
}

// a projection into the residual stream (dec_proj, accumulate 1) as a phase of the persistent step:
// the input in (B, Cin) staged, then x[b, item] += in[b] . wt[item] (w1: the row's first chunks)
template <int R>
__device__ __forceinline__ void step_residual(float* xs, const float* in, int Cin, const act_t* wt, const vec8* w1,
                                              float* x, int B, int C, int item, float eps) {
    const int lane = threadIdx.x & 31;
    stage_rows<R, true>(xs, in, nullptr, nullptr, nullptr, 0, B, Cin, nullptr, eps);
    if (item < C) {
        float acc[R];
        warp_dot<R>(wt + (i64)item * Cin, w1, xs, Cin, B, acc);
        if (lane < B) { float* p = x + (i64)lane * C + item; *p = __fadd_rn(__ldcg(p), pick<R>(acc, lane)); }
    }
}

template <int R, int D>
__device__ void dec_step_impl(float* x, const int* __restrict__ ids, const act_t* __restrict__ wte,
                              const unsigned long long* __restrict__ lp, int L, const act_t* __restrict__ head,
                              const act_t* __restrict__ gf, const float* __restrict__ cosb,
                              const float* __restrict__ sinb, float* q, float* att, float* s, float* part,
                              int* tickets, float* logits, int* state, unsigned int* bar, int B, int C, int H,
                              int K, int S, int F, int V, int NS, int CH, float eps, float scale_log2) {
    extern __shared__ float xs[];
    __shared__ AttnShared<D> ash[2];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int hd = D / 2, n_rot = (H + K) * hd, n_qkv = (H + 2 * K) * hd, HD = H * D;
    const int item = blockIdx.x * DEC_WARPS + warp;
    const int pos = state[0];
    unsigned int target = __ldcg(bar + 1);
    // a phase's weight rows, read after this block arrives at the barrier before it and before it
    // waits there (each phase loads the pointers it uses where it uses them)
    vec8 w1[NCH], w2[NCH];
    int j1 = 0, j2 = 0, qh = 0, qi = 0;
    if (item < n_rot) qkv_rows(true, item, 1, H, K, D, qh, qi, j1, j2);
    else qkv_rows(false, 2 * (item - n_rot), 1, H, K, D, qh, qi, j1, j2);
    if (item < n_qkv) { fetch_row((const act_t*)lp[1] + (i64)j1 * C, C, w1); fetch_row((const act_t*)lp[1] + (i64)j2 * C, C, w2); }
    for (int l = 0; l < L; l++) {
        const unsigned long long* P = lp + 8 * l;
        {   // qkv (dec_qkv): w1, w2 are rows j1, j2
            if (l > 0) grid_wait(bar, target);
            stage_rows<R, true>(xs, x, l == 0 ? wte : nullptr, l == 0 ? ids : nullptr,
                                l == 0 && blockIdx.x == 0 ? x : nullptr, 0, B, C, (const act_t*)P[0], eps);
            if (item < n_qkv) {
                const act_t* wqkv = (const act_t*)P[1];
                float a1[R], a2[R];
                warp_dot<R>(wqkv + (i64)j1 * C, w1, xs, C, B, a1);
                warp_dot<R>(wqkv + (i64)j2 * C, w2, xs, C, B, a2);
                if (lane < B)
                    qkv_store(pick<R>(a1, lane), pick<R>(a2, lane), item < n_rot, qh, qi, 1, lane, pos, cosb, sinb,
                              q, (act_t*)P[6], (act_t*)P[7], H, K, D, S);
            }
            grid_arrive(bar);
            grid_wait(bar, target);
        }
        {   // attention (dec_attn): two blocks of 128 threads a CTA, each with its own named barrier
            const int half = warp >> 2, vb = blockIdx.x * 2 + half;
            if (vb < B * H * NS)
                step_attn<D>(vb, NS, ash[half], 1 + half, q, (const act_t*)P[6], (const act_t*)P[7], part, tickets,
                             att, state, H, K, S, CH, scale_log2);
            grid_arrive(bar);
            if (item < C) fetch_row((const act_t*)P[2] + (i64)item * HD, HD, w1);
            grid_wait(bar, target);
        }
        {   // x += att . wo (dec_proj): w1 is row item
            step_residual<R>(xs, att, HD, (const act_t*)P[2], w1, x, B, C, item, eps);
            grid_arrive(bar);
            if (item < F) {
                fetch_row((const act_t*)P[4] + (i64)item * C, C, w1);
                fetch_row((const act_t*)P[4] + (i64)(F + item) * C, C, w2);
            }
            grid_wait(bar, target);
        }
        {   // gate/up + SwiGLU (dec_gateup): w1, w2 are rows item, F + item
            stage_rows<R, true>(xs, x, nullptr, nullptr, nullptr, 0, B, C, (const act_t*)P[3], eps);
            if (item < F) {
                const act_t* wgu = (const act_t*)P[4];
                float a1[R], a2[R];
                warp_dot<R>(wgu + (i64)item * C, w1, xs, C, B, a1);
                warp_dot<R>(wgu + (i64)(F + item) * C, w2, xs, C, B, a2);
                if (lane < B) s[(i64)lane * F + item] = swiglu1(pick<R>(a1, lane), pick<R>(a2, lane));
            }
            grid_arrive(bar);
            if (item < C) fetch_row((const act_t*)P[5] + (i64)item * F, F, w1);
            grid_wait(bar, target);
        }
        {   // x += s . w_down (dec_proj): w1 is row item
            step_residual<R>(xs, s, F, (const act_t*)P[5], w1, x, B, C, item, eps);
            grid_arrive(bar);
            if (l + 1 < L) {   // the next layer's qkv rows
                if (item < n_qkv) {
                    const act_t* wn = (const act_t*)P[8 + 1];
                    fetch_row(wn + (i64)j1 * C, C, w1);
                    fetch_row(wn + (i64)j2 * C, C, w2);
                }
            } else if (item < V) {
                fetch_row(head + (i64)item * C, C, w1);
            }
        }
    }
    {   // RMSNorm + the head (dec_proj, accumulate 0): w1 is row item
        grid_wait(bar, target);
        stage_rows<R, true>(xs, x, nullptr, nullptr, nullptr, 0, B, C, gf, eps);
        if (item < V) {
            float acc[R];
            warp_dot<R>(head + (i64)item * C, w1, xs, C, B, acc);
            if (lane < B) logits[(i64)lane * V + item] = pick<R>(acc, lane);
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) { state[0] += 1; state[1] += 1; bar[1] = target; }
}

#ifdef DEC_STEP_R      // a module of its own a (R, D) (ops/cuda_decode.py compiles the one it launches)
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 2) dec_step(
        float* x, const int* ids, const act_t* wte, const unsigned long long* lp, int L, const act_t* head,
        const act_t* gf, const float* cosb, const float* sinb, float* q, float* att, float* s, float* part,
        int* tickets, float* logits, int* state, unsigned int* bar, int B, int C, int H, int K, int S,
        int F, int V, int NS, int CH, float eps, float scale_log2) {
    dec_step_impl<DEC_STEP_R, DEC_STEP_D>(x, ids, wte, lp, L, head, gf, cosb, sinb, q, att, s, part, tickets, logits,
                                          state, bar, B, C, H, K, S, F, V, NS, CH, eps, scale_log2);
}
#endif

// ------------------------------------------------------------------------------------------------
// Sampling on the device, one block per sequence, with the CPU's rules and seed semantics
// (bytemodel/sampling.py sample_next): z = logits / temperature; top-k keeps z >= the k-th largest;
// p = softmax(z); top-p keeps the smallest prefix of ids by descending p (ties: lower id first)
// whose mass reaches top_p; then the id is the first whose normalised cumulative mass (in id
// order) exceeds u, one uniform double in [0, 1) from the sequence's own PCG64 stream: the draw
// NumPy's Generator.random() makes, from the state that np.random.default_rng(seed) starts in
// (so Generator.choice(V, p=p) on the CPU and this kernel use the same u). Probabilities in fp64.
// Greedy (temperature 0) is the first argmax and draws nothing.
// rng: (B, 4) uint64 [state_hi, state_lo, inc_hi, inc_lo]; smem: V doubles + 2 * P2 words.
// allowed: null, or V bytes: the ids that may be drawn (generation's byte mask; the others count as -inf).

__device__ __forceinline__ double pcg64_next_double(unsigned long long* st) {
    const unsigned long long MH = 2549297995355413924ULL, ML = 4865540595714422341ULL;
    unsigned long long sh = st[0], sl = st[1], ih = st[2], il = st[3];
    unsigned long long lo = sl * ML;
    unsigned long long hi = __umul64hi(sl, ML) + sl * MH + sh * ML;
    unsigned long long lo2 = lo + il;
    hi = hi + ih + (lo2 < lo ? 1ULL : 0ULL);
    st[0] = hi; st[1] = lo2;
    unsigned long long xr = hi ^ lo2;
    unsigned int rot = (unsigned int)(hi >> 58);
    unsigned long long out = (xr >> rot) | (xr << ((64u - rot) & 63u));
    return (double)(out >> 11) * (1.0 / 9007199254740992.0);
}

// exclusive prefix (in thread order) of each thread's `mine`, and the block total
__device__ void block_prefix(double mine, double* excl, double* total) {
    __shared__ double ws[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    double v = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) { double t = __shfl_up_sync(FULL, v, o); if (lane >= o) v += t; }
    if (lane == 31) ws[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double w = lane < nw ? ws[lane] : 0.0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) { double t = __shfl_up_sync(FULL, w, o); if (lane >= o) w += t; }
        ws[lane] = w;
    }
    __syncthreads();
    *excl = (warp > 0 ? ws[warp - 1] : 0.0) + v - mine;
    *total = ws[nw - 1];
    __syncthreads();
}

__device__ double block_sum_d(double v) {
    double e, t;
    block_prefix(v, &e, &t);
    return t;
}

__device__ __forceinline__ bool sort_before(float ka, int ia, float kb, int ib) {
    return ka > kb || (ka == kb && ia < ib);
}

extern "C" __global__ void dec_pdl_probe(int* flag) {   // ops/cuda_decode.py: can this GPU launch with PDL?
    PDL_LAUNCH();
    PDL_WAIT();
    if (threadIdx.x == 0 && blockIdx.x == 0) flag[0] += 1;
}

// the logit sampling sees: -inf for an id the mask leaves out (allowed: V bytes, 0 = never drawn; null: every id),
// so it gets no mass and is never the argmax, as the host's sampler with -inf added to those logits
__device__ __forceinline__ float masked_logit(const float* lg, const unsigned char* __restrict__ allowed, int i) {
    return (allowed == nullptr || allowed[i]) ? lg[i] : -INFINITY;
}

// logits and state are written by the kernel before (the head): plain loads, not the read-only path
extern "C" __global__ void dec_sample(const float* logits, int ld, int V, int P2,
                                      float temperature, int top_k, double top_p,
                                      unsigned long long* rng, int* ids, int* out, int cap,
                                      const int* state, const unsigned char* __restrict__ allowed) {
    extern __shared__ double p[];                       // V
    float* key = reinterpret_cast<float*>(p + V);       // P2 (sorted logits)
    int* idx = reinterpret_cast<int*>(key + P2);        // P2 (their ids)
    __shared__ double su;
    __shared__ int chosen;
    __shared__ float bestv[32];
    __shared__ int besti[32];
    const int b = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    const int lane = tid & 31, warp = tid >> 5, nw = (nt + 31) >> 5;
    const float* lg_row = logits + (i64)b * ld;
    PDL_LAUNCH();
    PDL_WAIT();                                   // the logits of the step before
    const int t = state[1];
    if (temperature == 0.f) {                           // greedy: first index of the maximum
        float bv = -INFINITY; int bi = 0x7fffffff;
        for (int i = tid; i < V; i += nt) { float v = masked_logit(lg_row, allowed, i); if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; } }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(FULL, bv, o); int oi = __shfl_xor_sync(FULL, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) { bestv[warp] = bv; besti[warp] = bi; }
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < nw; w++) if (bestv[w] > bv || (bestv[w] == bv && besti[w] < bi)) { bv = bestv[w]; bi = besti[w]; }
            if (bi >= V) bi = 0;                        // all NaN: id 0
            ids[b] = bi; out[(i64)b * cap + t] = bi;
        }
        return;
    }
    if (tid == 0) su = pcg64_next_double(rng + 4 * b);
    const double T = (double)temperature;
    const bool sorted = (top_k > 0 && top_k < V) || top_p < 1.0;
    float kth = -INFINITY;
    if (sorted) {
        for (int i = tid; i < P2; i += nt) { key[i] = i < V ? masked_logit(lg_row, allowed, i) : -INFINITY; idx[i] = i; }
        __syncthreads();
        for (int k = 2; k <= P2; k <<= 1) {                 // bitonic sort, descending (ties: lower id first)
            for (int j = k >> 1; j > 0; j >>= 1) {
                for (int i = tid; i < P2; i += nt) {
                    int ixj = i ^ j;
                    if (ixj > i) {
                        bool first = sort_before(key[i], idx[i], key[ixj], idx[ixj]);
                        if ((i & k) == 0 ? !first : first) {
                            float tk = key[i]; key[i] = key[ixj]; key[ixj] = tk;
                            int ti = idx[i]; idx[i] = idx[ixj]; idx[ixj] = ti;
                        }
                    }
                }
                __syncthreads();
            }
        }
        if (top_k > 0 && top_k < V) kth = key[top_k - 1];
    }
    // max of the kept z, then p = exp(z - max) over the kept ids, and the sum
    float bv = -INFINITY;
    for (int i = tid; i < V; i += nt) bv = fmaxf(bv, masked_logit(lg_row, allowed, i));
    bv = warp_max(bv);
    if (lane == 0) bestv[warp] = bv;
    __syncthreads();
    float mxf = bestv[0];
    for (int w = 1; w < nw; w++) mxf = fmaxf(mxf, bestv[w]);
    const double zmax = (double)mxf / T;
    double part = 0.0;
    for (int i = tid; i < V; i += nt) {
        float v = masked_logit(lg_row, allowed, i);
        double e = v >= kth ? exp((double)v / T - zmax) : 0.0;
        p[i] = e;
        part += e;
    }
    const double S = block_sum_d(part);                 // (has synced: p is complete)
    for (int i = tid; i < V; i += nt) p[i] /= S;
    __syncthreads();
    const int chunk = (V + nt - 1) / nt;
    const int c0 = min(V, tid * chunk), c1 = min(V, c0 + chunk);
    if (top_p < 1.0) {                                  // keep sorted positions j < n_keep
        double mine = 0.0;
        for (int j = c0; j < c1; j++) mine += p[idx[j]];
        double run, tot;
        block_prefix(mine, &run, &tot);
        int cnt = 0;
        for (int j = c0; j < c1; j++) { run += p[idx[j]]; if (run < top_p) cnt++; }
        // the c_j are increasing, so the count below top_p is a prefix: sum the per-thread counts
        double n_below = block_sum_d((double)cnt);
        int n_keep = (int)n_below + 1;
        for (int j = tid; j < V; j += nt) if (j >= n_keep) p[idx[j]] = 0.0;
        __syncthreads();
    }
    // inverse CDF in id order: first i with cdf_i / cdf_last > u
    double mine = 0.0;
    for (int i = c0; i < c1; i++) mine += p[i];
    double run, tot;
    block_prefix(mine, &run, &tot);
    if (tid == 0) chosen = 0x7fffffff;
    __syncthreads();
    const double u = su;
    int first = 0x7fffffff;
    for (int i = c0; i < c1; i++) {
        run += p[i];
        if (run / tot > u) { first = i; break; }
    }
    if (first != 0x7fffffff) atomicMin(&chosen, first);
    __syncthreads();
    if (tid == 0) {
        int c = chosen;
        if (c >= V) c = V - 1;
        ids[b] = c; out[(i64)b * cap + t] = c;
    }
}
