// Shared definitions for the bytemodel CUDA kernels (compiled at run time by NVRTC via CuPy).
//
// The activation type `act_t` is chosen per compiled module by a macro:
//   ACT_F16 (default) -> __half,  ACT_BF16 -> __nv_bfloat16,  ACT_F32 -> float.
// Everything accumulates in float. No host headers: NVRTC-friendly.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef INFINITY   // NVRTC has no <math.h>
#define INFINITY __int_as_float(0x7f800000)
#endif

typedef unsigned int u32;
typedef long long i64;

#if defined(ACT_BF16)
typedef __nv_bfloat16 act_t;
typedef __nv_bfloat162 act2_t;
#define MMA_T "bf16"
__device__ __forceinline__ float to_f(act_t x) { return __bfloat162float(x); }
__device__ __forceinline__ act_t from_f(float x) { return __float2bfloat16(x); }
__device__ __forceinline__ act2_t from_f2(float a, float b) { return __floats2bfloat162_rn(a, b); }
__device__ __forceinline__ float2 to_f2(act2_t x) { return __bfloat1622float2(x); }
#define HAS_MMA 1
#elif defined(ACT_F32)
typedef float act_t;
typedef float2 act2_t;
__device__ __forceinline__ float to_f(act_t x) { return x; }
__device__ __forceinline__ act_t from_f(float x) { return x; }
__device__ __forceinline__ act2_t from_f2(float a, float b) { return make_float2(a, b); }
__device__ __forceinline__ float2 to_f2(act2_t x) { return x; }
#define HAS_MMA 0
#else
typedef __half act_t;
typedef __half2 act2_t;
#define MMA_T "f16"
__device__ __forceinline__ float to_f(act_t x) { return __half2float(x); }
__device__ __forceinline__ act_t from_f(float x) { return __float2half_rn(x); }
__device__ __forceinline__ act2_t from_f2(float a, float b) { return __floats2half2_rn(a, b); }
__device__ __forceinline__ float2 to_f2(act2_t x) { return __half22float2(x); }
#define HAS_MMA 1
#endif

// 8 activations in one 16-byte (fp16/bf16) or two 16-byte (fp32) accesses
struct __align__(16) vec8 { act_t v[8]; };

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// VW = 8: one 16-byte access of 8 activations (needs 8-element alignment); VW = 1: one element
template <int VW>
__device__ __forceinline__ void load_row(const act_t* p, int c, float* f) {
    if (VW == 8) {
        vec8 v = *reinterpret_cast<const vec8*>(p + c);
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = to_f(v.v[i]);
    } else {
        f[0] = to_f(p[c]);
    }
}
// RoPE on 8 pairs (x1 from a, x2 from c2): o1 = x1 cos - x2 sin, o2 = x2 cos + x1 sin, rounded to
// act_t (rope.cu's forward and step.cu's one-token pass: the same bits from both)
__device__ __forceinline__ void rope_pairs8(const vec8& a, const vec8& c2, const float* cs, const float* sn,
                                            vec8& o1, vec8& o2) {
#pragma unroll
    for (int e = 0; e < 8; e++) {
        float x1 = to_f(a.v[e]), x2 = to_f(c2.v[e]);
        o1.v[e] = from_f(x1 * cs[e] - x2 * sn[e]);
        o2.v[e] = from_f(x2 * cs[e] + x1 * sn[e]);
    }
}
template <int VW>
__device__ __forceinline__ void store_row(act_t* p, int c, const float* f) {
    if (VW == 8) {
        vec8 v;
#pragma unroll
        for (int i = 0; i < 8; i++) v.v[i] = from_f(f[i]);
        *reinterpret_cast<vec8*>(p + c) = v;
    } else {
        p[c] = from_f(f[0]);
    }
}

// The dropout hash (numpy_ops.dropout_keep's rule; dropout.cu and the attention kernels draw with it):
// element g is kept when byte g % 4 of drop_word(g / 4, k0, k1) is >= the threshold.
__device__ __forceinline__ u32 fmix32(u32 x) {   // murmur3's 32-bit finaliser
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return x;
}

__device__ __forceinline__ u32 drop_word(u32 c, u32 k0, u32 k1) { return fmix32(fmix32(c ^ k0) ^ k1); }
// the hash with HR rounds: 2 is drop_word (every shipped kernel); 1 and 0 (one finaliser; one
// multiply, no mixing worth the name) only time what the rounds cost (flash_hopper_variants.cu)
template <int HR>
__device__ __forceinline__ u32 drop_word_r(u32 c, u32 k0, u32 k1) {
    if constexpr (HR == 2) return drop_word(c, k0, k1);
    else if constexpr (HR == 1) return fmix32(c ^ k0) ^ k1;
    else return (c ^ k0) * 0x9e3779b1u;
}

// Attention-probability dropout (training; numpy_ops.attention_forward's drop=), drawn inside the
// attention kernels (flash_attn.cu's FA2 ones, flash_hopper.cu's wgmma ones): probability
// (b, h, i, j) of the whole batch (query i, key j, S keys a row) is element
// g = off + ((b H + h) T + i) S + j of the dropout hash (the rule of numpy_ops.attn_keep), kept
// when its byte >= thr, then scaled by `scale` = 256 / (256 - thr). Nothing is stored: the
// backward draws the same bits again. thr == 0 is never launched (the kernels without dropout
// are separate instances, DROP = false). When off and S are multiples of 4 (`aligned`: a hash
// word is 4 keys of one row) lanes share words through shuffles, one hash per 4 probabilities;
// otherwise each probability hashes its own word. Both helpers take a tile in mma.sync's C
// layout (16 x 8 per warp; lane = 4 g + t holds rows g and g + 8, columns 2 t and 2 t + 1), which
// is also the layout of a wgmma accumulator's 8-column blocks.
struct Drop {
    i64 off;
    u32 k0, k1, thr;
    float scale;
};

__device__ __forceinline__ float drop_keep(float p, u32 byte, const Drop& dr) {
    return (byte & 0xffu) >= dr.thr ? p * dr.scale : 0.f;
}

// The forward's tile row (queries are rows): s[nt][2 rh + e] is key n0 + 8 nt + 2 t + e of the
// row whose element index at key n0 is rb. aligned: lanes t and t ^ 1 (same row, keys
// 8 nt + 4 (t >> 1) .. + 3 of tiles nt and nt + 1) hash one word each and swap.
template <int NTL, int HR = 2>
__device__ __forceinline__ void drop_fwd_row(float (&s)[NTL][4], int rh, i64 rb, int t, bool aligned,
                                             const Drop& dr) {
    if (aligned) {
#pragma unroll
        for (int nt = 0; nt < NTL; nt += 2) {
            u32 mine = drop_word_r<HR>((u32)((rb + (nt + (t & 1)) * 8 + (t >> 1) * 4) >> 2), dr.k0, dr.k1);
            u32 other = __shfl_xor_sync(0xffffffffu, mine, 1);
            u32 w0 = ((t & 1) ? other : mine) >> (16 * (t & 1));   // keys 2t, 2t + 1: bytes 2 (t & 1), + 1
            u32 w1 = ((t & 1) ? mine : other) >> (16 * (t & 1));
            s[nt][2 * rh] = drop_keep(s[nt][2 * rh], w0, dr);
            s[nt][2 * rh + 1] = drop_keep(s[nt][2 * rh + 1], w0 >> 8, dr);
            s[nt + 1][2 * rh] = drop_keep(s[nt + 1][2 * rh], w1, dr);
            s[nt + 1][2 * rh + 1] = drop_keep(s[nt + 1][2 * rh + 1], w1 >> 8, dr);
        }
    } else {
#pragma unroll
        for (int nt = 0; nt < NTL; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                i64 gi = rb + nt * 8 + 2 * t + e;
                u32 w = drop_word_r<HR>((u32)(gi >> 2), dr.k0, dr.k1);
                s[nt][2 * rh + e] = drop_keep(s[nt][2 * rh + e], w >> (8 * (int)(gi & 3)), dr);
            }
    }
}

// The backward's tile of S^T (keys are rows): z[e] (the kept scale or 0) of element e of this
// lane's 16 x 8 fragment, key kb + g + 8 (e / 2) of query column 2 t + (e % 2), where the
// element index of (column c, key j) is base + c S + j. aligned: the keys 4a .. 4a + 3 of one
// query are the lanes 16 (g / 4) + 4 i + t, i = 0 .. 3, which need one word for each e: lane i
// hashes the one for e = i, then all shuffle.
template <int HR = 2>
__device__ __forceinline__ void drop_bwd_frag(float (&z)[4], i64 base, int S, int kb, int lane,
                                              bool aligned, const Drop& dr) {
    const int g = lane / 4, t = lane % 4;
    u32 wmine = 0;
    if (aligned) {
        const int e = g & 3;
        wmine = drop_word_r<HR>((u32)((base + (i64)(2 * t + (e & 1)) * S + kb + (g & ~3) + (e >> 1) * 8) >> 2),
                                dr.k0, dr.k1);
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
        u32 byte;
        if (aligned) {
            byte = __shfl_sync(0xffffffffu, wmine, (lane & 0x13) | (e << 2)) >> (8 * (g & 3));
        } else {
            const i64 gi = base + (i64)(2 * t + (e & 1)) * S + kb + g + (e >> 1) * 8;
            byte = drop_word_r<HR>((u32)(gi >> 2), dr.k0, dr.k1) >> (8 * (int)(gi & 3));
        }
        z[e] = drop_keep(1.f, byte, dr);
    }
}

#if HAS_MMA
// ---- for the tensor-core kernels (flash_attn.cu, flash_hopper.cu, decode.cu): softmax constants, shared
// memory addresses, cp.async (16 bytes, zero-filled when !valid; 4 bytes) and its groups, two floats
// packed into one register of act2_t
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

__device__ __forceinline__ u32 smem_u32(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(void* s, const act_t* g, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_u32(s)), "l"(g), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void* s, const float* g) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(smem_u32(s)), "l"(g));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}

// C (16x8 fp32) += A (16x16) B (16x8): the fragment layouts are written where they are used
// (flash_attn.cu, decode.cu)
__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32." MMA_T "." MMA_T ".f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 pack2(float a, float b) {
    act2_t h = from_f2(a, b);
    return *reinterpret_cast<u32*>(&h);
}

// a backward key block no query sees (flash_attn.cu's and flash_hopper.cu's): its BN rows of dK and
// dV (rows row0 + n0 .., D wide) zeroed, those below S
template <int BN, int D, int NT>
__device__ __forceinline__ void zero_key_grads(act_t* dK, act_t* dV, i64 row0, int n0, int S) {
    for (int i = threadIdx.x; i < BN * D; i += NT) {
        int r = i / D, c = i % D;
        if (n0 + r < S) {
            dK[(row0 + n0 + r) * D + c] = from_f(0.f);
            dV[(row0 + n0 + r) * D + c] = from_f(0.f);
        }
    }
}

// the ordered dQ reduction's counters (flash_attn.cu's and flash_hopper.cu's backward; CUTLASS's
// generic barrier: acquire load, then release by fence + relaxed add)
__device__ __forceinline__ int ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ int ld_relaxed(const int* p) {
    int v;
    asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
__device__ __forceinline__ void red_release(int* p, int v) {
    fence_acq_rel();
    asm volatile("red.relaxed.gpu.global.add.s32 [%0], %1;\n" :: "l"(p), "r"(v) : "memory");
}
#endif
