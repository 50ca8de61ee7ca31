// The qkv split and RoPE (qkv_rope_forward / qkv_rope_backward of numpy_ops), rotate-half
// convention. Launched by cuda_ops.
//
// Shapes: qkv / dqkv (B*T, (H+2K)*D) act_t; q, dq (B, H, T, D); k, v, dk, dv (B, K, T, D);
// cos / sin (T, D/2) act_t. The forward rotates q and k by the angle, the backward by minus it.
// Pure maps (each output element written once): deterministic.
#include "common.cuh"

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

// Backward, 8 neighbouring i per thread (D % 16 == 0): 16-byte accesses; dq, dk, dv in the
// activation dtype (rotated by minus the angle), dv copied.
extern "C" __global__ void qkv_rope_bwd_v8(const act_t* __restrict__ dq, const act_t* __restrict__ dk,
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
        const act_t* src;
        if (j < H) src = dq + (((i64)b * H + j) * T + t) * D;
        else if (j < H + K) src = dk + (((i64)b * K + (j - H)) * T + t) * D;
        else src = dv + (((i64)b * K + (j - H - K)) * T + t) * D;
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
            o1.v[e] = from_f(x1 * cs[e] + x2 * sn[e]);
            o2.v[e] = from_f(x2 * cs[e] - x1 * sn[e]);
        }
        *reinterpret_cast<vec8*>(dst + i) = o1;
        *reinterpret_cast<vec8*>(dst + i + h2) = o2;
    }
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
        rope_pairs8(a, c2, cs, sn, o1, o2);
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
