// FlashAttention forward for Hopper (sm_90a): the products on warpgroup matrix instructions
// (wgmma, m64nNk16, FP16 or BF16 in, FP32 accumulate), causal, grouped-query, head dims 64 and
// 128, any T and S >= T; the same contract as flash_attn.cu's flash_fwd (the FlashAttention-2
// kernels, which stay for other GPUs and head dims), attention dropout included (the _drop twins
// draw the mask of common.cuh's Drop, bit for bit FA2's). Compiled by NVRTC for sm_90a only
// (cuda_ops._hopper_module); selected on compute capability 9.x.
//
// Layout, arguments and outputs: flash_attn.cu's forward (q (B, H, T, D), k/v (B, K, S, D) by
// strides, O written through strides, LSE (natural log) in (B, H, T)).
//
// One CTA = 128 query rows of one (b, h) = two warpgroups of 64 rows; it loops over key tiles
// of BN keys with an online softmax (base-2 exponentials), K/V tiles double buffered through
// cp.async. Per tile and warpgroup: S = Q K^T is one chain of D / 16 wgmma with both operands in
// shared memory; P stays in registers (the accumulator's layout is the A operand's, as FA2's
// trick with mma.sync) and O += P V is BN / 16 wgmma with A from registers. A warpgroup whose 64
// rows see none of a tile's keys skips it; fully masked tiles are never loaded.
//
// Shared memory holds every tile in the instructions' no-swizzle "core matrix" layout: 8 rows of
// 16 bytes (8 elements) are one contiguous 128-byte core matrix; a group of 8 rows is D / 8 core
// matrices side by side (columns 0-7, 8-15, ...); groups follow each other. Element (r, c) of a
// tile is at byte (r / 8) * 16 D + (c / 8) * 128 + (r % 8) * 16 + (c % 8) * 2, and the i-th
// 16-byte chunk of a cp.async sweep (r % 8 fastest, then c / 8, then r / 8) lands at byte 16 i.
// Q and K are read "K-major" (the reduction dim, D, inside a core matrix row): leading byte
// offset (next core matrix along the reduction) 128, stride byte offset (next 8 rows) 16 D.
// V is read "MN-major" (keys are the reduction dim, D the output columns, each core matrix row
// 8 output columns of one key): leading byte offset (next 8 keys) 16 D, stride byte offset (next
// 8 columns) 128; the B operand transposed (imm-trans-b = 1).
//
// Fragment layout of a warpgroup's accumulator (64 x N, fp32): warp w of the group holds rows
// 16 w .. 16 w + 15; with g = lane / 4, t = lane % 4, register 4 i + e holds row 16 w + g + 8 (e / 2),
// column 8 i + 2 t + (e % 2): mma.sync's C layout repeated over N / 8 column blocks. The A
// operand from registers (64 x 16, 16-bit) is mma.sync's A layout per warp, so a row of P packs
// into A with no shuffles.
#include "common.cuh"

#if HAS_MMA

// the descriptors' byte offsets (leading, stride) for Q/K and V, as expressions of D. The advance
// from one 16-wide step of the reduction to the next is the layout's own: 256 bytes for Q/K (two
// core matrices), 32 D for V (16 keys = two groups of 8).
#define DESC_QK_L(D) 128
#define DESC_QK_S(D) (16 * (D))
#define DESC_V_L(D) (16 * (D))
#define DESC_V_S(D) 128
#define SW1_V_L (R * 128)
#define SW1_V_S 1024

typedef unsigned long long u64;

// A shared-memory matrix descriptor: start address, leading and stride byte offsets (each >> 4),
// no swizzle, base offset 0.
__device__ __forceinline__ u64 gmma_desc(const void* p, u32 lbo, u32 sbo) {
    u64 d = (u64)((smem_u32(p) & 0x3FFFF) >> 4);
    d |= (u64)((lbo >> 4) & 0x3FFF) << 16;
    d |= (u64)((sbo >> 4) & 0x3FFF) << 32;
    return d;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
// keep the compiler from moving accumulator reads or writes across an asynchronous product
template <int N> __device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i]) :: "memory");
}
// named barriers (ids 1, 2; 0 is __syncthreads) over both warpgroups: sync waits, arrive does not
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(n) : "memory"); }

// four fp32 adds to p[0..3] (16-byte aligned) as one reduction (sm_90: red.global.add.v4.f32); the
// same values added to the same elements as four atomicAdd, so the same bits
__device__ __forceinline__ void red_add_v4(float* p, float a, float b, float c, float d) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" :: "l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// rows [r0, r0 + R) of a (rows, D) matrix with row stride rs into the core-matrix layout at s;
// rows >= nrows are zero-filled. Chunk i: r % 8 = i % 8, c / 8 = (i / 8) % (D / 8), r / 8 = i / D.
template <int R, int D, int NT>
__device__ __forceinline__ void load_tile_cm(unsigned char* s, const act_t* g, i64 rs, int r0, int nrows) {
#pragma unroll
    for (int i = threadIdx.x; i < R * D / 8; i += NT) {
        int r = (i / D) * 8 + (i % 8), c = ((i / 8) % (D / 8)) * 8;
        bool ok = r0 + r < nrows;
        cp_async16(s + 16 * i, g + (ok ? (i64)(r0 + r) * rs + c : 0), ok);
    }
}

// The two shared-memory layouts, SW = 0: the core-matrix layout above (no swizzle); SW = 1: the
// 128-byte swizzle: a tile is D / 64 column blocks ("atoms") of 64 columns, each R rows of 128
// bytes, and the 16-byte chunk c of row r sits at chunk c ^ (r % 8) of its row, so the tensor
// cores' reads of eight rows at one column hit eight different bank groups. Descriptors: Q and
// K K-major (stride byte offset 1024 = 8 rows; the leading offset unused: one 16-wide step stays
// inside a 128-byte row), a step of 16 columns = +32 bytes in an atom; V MN-major (stride byte
// offset 1024 = 8 keys, leading offset R 128 = the next 64 output columns), a step of 16 keys =
// +2048 bytes. Every tile starts on a 1024-byte boundary (the swizzle's period).
template <int D, int SW> struct Lay;
template <int D> struct Lay<D, 0> {
    template <int R, int NT>
    __device__ static void load(unsigned char* s, const act_t* g, i64 rs, int r0, int nrows) {
        load_tile_cm<R, D, NT>(s, g, rs, r0, nrows);
    }
    __device__ static u64 qk(const unsigned char* p, int) { return gmma_desc(p, DESC_QK_L(D), DESC_QK_S(D)); }
    __device__ static u32 qk_step(int kk, int) { return kk * 256; }
    __device__ static u64 v(const unsigned char* p, int) { return gmma_desc(p, DESC_V_L(D), DESC_V_S(D)); }
    __device__ static u32 v_step(int kk) { return kk * 32 * D; }
    __device__ static u32 rows_at(int r, int) { return r * D * 2; }   // byte offset of row r (r % 8 == 0)
};
template <int D> struct Lay<D, 1> {
    template <int R, int NT>
    __device__ static void load(unsigned char* s, const act_t* g, i64 rs, int r0, int nrows) {
        constexpr int CPR = D / 8;   // chunks a row
#pragma unroll
        for (int i = threadIdx.x; i < R * CPR; i += NT) {
            int r = i / CPR, c = i % CPR;
            bool ok = r0 + r < nrows;
            unsigned char* dst = s + (c / 8) * R * 128 + r * 128 + (((c % 8) ^ (r % 8)) * 16);
            cp_async16(dst, g + (ok ? (i64)(r0 + r) * rs + c * 8 : 0), ok);
        }
    }
    __device__ static u64 sw(u64 d) { return d | (1ull << 62); }
    __device__ static u64 qk(const unsigned char* p, int) { return sw(gmma_desc(p, 16, 1024)); }
    __device__ static u32 qk_step(int kk, int R) { return (kk / 4) * R * 128 + (kk % 4) * 32; }
    __device__ static u64 v(const unsigned char* p, int R) { return sw(gmma_desc(p, SW1_V_L, SW1_V_S)); }
    __device__ static u32 v_step(int kk) { return kk * 2048; }
    __device__ static u32 rows_at(int r, int) { return r * 128; }
};

// ---- the wgmma wrappers (inline PTX names every accumulator register, so they are written out)
// ss: A and B from shared memory (descriptors); rs: A from registers. acc = 0: D = A B, else
// D += A B. TB: imm-trans-b (0: B is K-major, 1: MN-major).
template <int TB>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], u64 da, u64 db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." MMA_T "." MMA_T " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(acc), "n"(TB));
}

template <int TB>
__device__ __forceinline__ void wgmma_ss_n32(float (&d)[16], u64 da, u64 db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32." MMA_T "." MMA_T " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, %19;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(da), "l"(db), "r"(acc), "n"(TB));
}

template <int TB>
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const u32 (&a)[4], u64 db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." MMA_T "." MMA_T " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
}

template <int TB>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], u64 da, u64 db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." MMA_T "." MMA_T " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, %67;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(acc), "n"(TB));
}

template <int TB>
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const u32 (&a)[4], u64 db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." MMA_T "." MMA_T " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
}

template <int N> struct Wg;
template <> struct Wg<32> {   // (the split dQ product at D = 64: ss only)
    template <int TB> __device__ static void ss(float (&d)[16], u64 a, u64 b, int acc) { wgmma_ss_n32<TB>(d, a, b, acc); }
};
template <> struct Wg<64> {
    template <int TB> __device__ static void ss(float (&d)[32], u64 a, u64 b, int acc) { wgmma_ss_n64<TB>(d, a, b, acc); }
    template <int TB> __device__ static void rs(float (&d)[32], const u32 (&a)[4], u64 b, int acc) { wgmma_rs_n64<TB>(d, a, b, acc); }
};
template <> struct Wg<128> {
    template <int TB> __device__ static void ss(float (&d)[64], u64 a, u64 b, int acc) { wgmma_ss_n128<TB>(d, a, b, acc); }
    template <int TB> __device__ static void rs(float (&d)[64], const u32 (&a)[4], u64 b, int acc) { wgmma_rs_n128<TB>(d, a, b, acc); }
};

// One key tile of the forward once its scores s = Q K^T (this warp's 16 rows from r0 = the tile's
// first row + the warp's, g and t the lane's row and column in the fragment) have landed: the causal
// and end mask (keys n0 ..), the online softmax in base 2 (row max m, row sum l, O rescaled),
// attention dropout (DROP, after the row sum), P packed as the A operand and O += P V issued over
// the V tile at vtile (Lay<D, SW>) and waited for. flash_fwd_h's and gpu/flash_tma.cu's flash_fwd_w's.
template <int D, int BN, int SW, bool DROP, int HR>
__device__ __forceinline__ void fwd_tile(float (&s)[BN / 2], float (&o)[D / 2], float (&mrow)[2], float (&lrow)[2],
                                         const unsigned char* vtile, int n0, int r0, int g, int t, int S, int offset,
                                         float scale_log2, int bh, int T, Drop dr) {
    using L = Lay<D, SW>;
    if (n0 + BN > S || n0 + BN - 1 > r0 + offset) {   // the tile touches the diagonal or the end
#pragma unroll
        for (int i = 0; i < BN / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int c = n0 + i * 8 + 2 * t + (e & 1);
                int r = r0 + g + (e >> 1) * 8;
                if (c >= S || c > r + offset) s[4 * i + e] = -INFINITY;
            }
    }
    // online softmax, two rows per thread (g: e = 0, 1; g + 8: e = 2, 3)
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < BN / 8; i++) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * rh], s[4 * i + 2 * rh + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float mnew = fmaxf(mrow[rh], mx * scale_log2);
        float muse = mnew == -INFINITY ? 0.f : mnew;
        float alpha = exp2f(mrow[rh] - muse);
        mrow[rh] = mnew;
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < BN / 8; i++) {
            float p0 = exp2f(s[4 * i + 2 * rh] * scale_log2 - muse);
            float p1 = exp2f(s[4 * i + 2 * rh + 1] * scale_log2 - muse);
            s[4 * i + 2 * rh] = p0; s[4 * i + 2 * rh + 1] = p1;
            sum += p0 + p1;
        }
        lrow[rh] = lrow[rh] * alpha + sum;
        if constexpr (DROP)   // after the row sum: l (and LSE) stay those of the undropped P
            drop_fwd_row<BN / 8, HR>(reinterpret_cast<float(&)[BN / 8][4]>(s), rh,
                                 dr.off + ((i64)bh * T + r0 + g + rh * 8) * S + n0, t,
                                 ((dr.off | (i64)S) & 3) == 0, dr);
#pragma unroll
        for (int i = 0; i < D / 8; i++) { o[4 * i + 2 * rh] *= alpha; o[4 * i + 2 * rh + 1] *= alpha; }
    }
    // O += P V: 16 keys a product, P's registers as the A operand
    u32 pa[BN / 16][4];
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        pa[kk][0] = pack2(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = pack2(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = pack2(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = pack2(s[8 * kk + 6], s[8 * kk + 7]);
    }
    const u64 dv = L::v(vtile, BN);
    fence_regs(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++)   // 16 keys = two groups of 8
        Wg<D>::template rs<1>(o, pa[kk], dv + (L::v_step(kk) >> 4), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
}

// The end of a forward: O = its sums over the row sums (this thread's two rows r0 and r0 + 8 of
// head h of batch row b), LSE (natural log); rows past T are not written.
template <int D>
__device__ __forceinline__ void fwd_finish(const float (&o)[D / 2], const float (&mrow)[2], const float (&lrow)[2],
                                           act_t* O, float* LSE, int b, int h, int H, int T, int r0,
                                           i64 osb, i64 osh, i64 ost, int t) {
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
        float l = lrow[rh];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        int r = r0 + rh * 8;
        float inv = 1.f / l;
        if (r < T) {
            act_t* orow = O + b * osb + h * osh + (i64)r * ost;
#pragma unroll
            for (int i = 0; i < D / 8; i++)
                *reinterpret_cast<act2_t*>(orow + i * 8 + 2 * t) = from_f2(o[4 * i + 2 * rh] * inv, o[4 * i + 2 * rh + 1] * inv);
            if (t == 0) LSE[((i64)b * H + h) * T + r] = (mrow[rh] + log2f(l)) * LN2;
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Forward. WGS warpgroups of 64 query rows (BM = 64 WGS rows, 128 WGS threads a CTA), BN keys a
// tile, STAGES shared-memory stages of K and V. OVERLAP: the scores of tile j + 1 are in flight
// on the tensor cores while the softmax of tile j runs (FlashAttention-3's pipelining within a
// warpgroup; two score register sets, loads two tiles ahead, STAGES >= 3); otherwise each
// product is waited for at once and a CTA's warps overlap only with other CTAs on the SM.
// PP (two warpgroups, no OVERLAP): ping-pong, FlashAttention-3's scheduling across warpgroups:
// the two take turns at the score product (named barriers 1 and 2: a warpgroup issues Q K^T
// only after the other's has finished), so one's softmax runs while the other's products do.
template <int D, int BN, int WGS, int STAGES, bool OVERLAP, int SW, bool PP, bool DROP = false, int HR = 2>
__device__ __forceinline__ void flash_fwd_h(
    const act_t* __restrict__ Q, const act_t* __restrict__ Kg, const act_t* __restrict__ Vg,
    act_t* __restrict__ O, float* __restrict__ LSE, int H, int KH, int T, int S,
    i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 kst, i64 vsb, i64 vsh, i64 vst,
    i64 osb, i64 osh, i64 ost, float scale_log2, Drop dr = Drop{0, 0u, 0u, 0u, 0.f}) {
    constexpr int BM = 64 * WGS, NT = 128 * WGS, TILE = BN * D * 2;   // bytes of one K or V tile
    constexpr int AHEAD = OVERLAP ? 2 : 1;                            // tiles loaded ahead
    static_assert(STAGES >= AHEAD + 1, "a stage per tile in flight and the one being read");
    static_assert(!PP || (WGS == 2 && !OVERLAP), "ping-pong takes two warpgroups, without OVERLAP");
    using L = Lay<D, SW>;
    extern __shared__ __align__(128) unsigned char smem_raw[];   // 1024 bytes more than the tiles
    unsigned char* sQ = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);   // [BM][D]
    unsigned char* sK = sQ + BM * D * 2;          // [STAGES][BN][D]
    unsigned char* sV = sK + STAGES * TILE;       // [STAGES][BN][D]

    const int mtile = gridDim.x - 1 - blockIdx.x;    // heaviest (last) query tiles first
    const int bh = blockIdx.y, b = bh / H, h = bh % H, kh = h / (H / KH);
    const int m0 = mtile * BM, offset = S - T;
    const act_t* q = Q + b * qsb + h * qsh;
    const act_t* k = Kg + b * ksb + kh * ksh;
    const act_t* v = Vg + b * vsb + kh * vsh;
    const int ntiles = (min(S, m0 + BM + offset) + BN - 1) / BN;            // tiles the CTA loads
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int wrow = wg * 64 + warp * 16;            // this warp's first row in the CTA's tile
    const int wtiles = (min(S, m0 + wg * 64 + 64 + offset) + BN - 1) / BN;  // tiles this warpgroup sees

    L::template load<BM, NT>(sQ, q, qst, m0, T);
#pragma unroll
    for (int a = 0; a < AHEAD; a++) {   // tiles 0 .. AHEAD - 1, one commit group each (Q with the first)
        if (a < ntiles) {
            L::template load<BN, NT>(sK + a * TILE, k, kst, a * BN, S);
            L::template load<BN, NT>(sV + a * TILE, v, vst, a * BN, S);
        }
        cp_commit();
    }

    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    const u64 dq = L::qk(sQ + L::rows_at(wg * 64, BM), BM);
    float s[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) s[i] = 0.f;   // overwritten (acc = 0); keeps them defined

    auto scores = [&](float (&dst)[BN / 2], int tile) {   // dst = Q K_tile^T, issued (not waited for)
        const u64 dk = L::qk(sK + (tile % STAGES) * TILE, BN);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)   // 16 columns of Q and K
            Wg<BN>::template ss<0>(dst, dq + (L::qk_step(kk, BM) >> 4), dk + (L::qk_step(kk, BN) >> 4), kk);
        wgmma_commit();
    };

    if constexpr (PP) { if (wg == 1) bar_arrive(1, 256); }   // warpgroup 0 goes first
    if (OVERLAP) {   // tile 0's scores before the loop
        cp_wait<AHEAD - 1>();
        fence_proxy_async();   // the cp.async writes, read next by the tensor cores (async proxy)
        __syncthreads();
        if (wtiles > 0) {
            scores(s, 0);
            wgmma_wait<0>();
            fence_regs(s);
        }
    }
    for (int j = 0; j < ntiles; j++) {
        // tile j + AHEAD into its stage, whose last reader (tile j + AHEAD - STAGES) is done
        if (j + AHEAD < ntiles) {
            const int st = (j + AHEAD) % STAGES;
            L::template load<BN, NT>(sK + st * TILE, k, kst, (j + AHEAD) * BN, S);
            L::template load<BN, NT>(sV + st * TILE, v, vst, (j + AHEAD) * BN, S);
        }
        cp_commit();
        cp_wait<1>();            // all but the newest group: tile j (j + 1 with OVERLAP) has landed
        fence_proxy_async();
        __syncthreads();
        const int n0 = j * BN;
        if constexpr (PP) {      // my turn at the tensor cores; a warpgroup past its tiles still takes it
            bar_sync(1 + wg, 256);
            if (j < wtiles) {
                scores(s, j);
                wgmma_wait<0>();
                fence_regs(s);
            }
            bar_arrive(2 - wg, 256);   // the other's turn
        }
        if (j < wtiles) {
            float sn[OVERLAP ? BN / 2 : 1];
            const bool next = OVERLAP && j + 1 < wtiles;
            if constexpr (OVERLAP) {
#pragma unroll
                for (int i = 0; i < BN / 2; i++) sn[i] = 0.f;
                if (next) scores(sn, j + 1);
            } else if constexpr (!PP) {
                scores(s, j);
                wgmma_wait<0>();
                fence_regs(s);
            }
            fwd_tile<D, BN, SW, DROP, HR>(s, o, mrow, lrow, sV + (j % STAGES) * TILE, n0, m0 + wrow, g, t, S, offset,
                                          scale_log2, bh, T, dr);   // (with OVERLAP its wait takes tile j + 1's scores too)
            if constexpr (OVERLAP) {
                fence_regs(sn);
#pragma unroll
                for (int i = 0; i < BN / 2; i++) s[i] = sn[i];
            }
        }
        __syncthreads();   // every warpgroup is done with stage j before it is loaded again
    }
    if constexpr (PP) { if (wg == 0) bar_sync(1, 256); }   // take warpgroup 1's last arrival
    fwd_finish<D>(o, mrow, lrow, O, LSE, b, h, H, T, m0 + wrow + g, osb, osh, ost, t);
}

#define FWD_H(NAME, D, BN, WGS, STAGES, OVERLAP, SW, PP, MINB)                                     \
    extern "C" __global__ void __launch_bounds__(128 * WGS, MINB) NAME(                            \
        const act_t* Q, const act_t* K, const act_t* V, act_t* O, float* LSE, int H, int KH, int T, \
        int S, i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 kst, i64 vsb, i64 vsh, i64 vst,     \
        i64 osb, i64 osh, i64 ost, float scale_log2) {                                             \
        flash_fwd_h<D, BN, WGS, STAGES, OVERLAP, SW, PP>(Q, K, V, O, LSE, H, KH, T, S, qsb, qsh, qst, \
                                                     ksb, ksh, kst, vsb, vsh, vst, osb, osh, ost,  \
                                                     scale_log2);                                  \
    }
// the same with attention dropout (common.cuh's Drop; cuda_ops launches it when drop= has p > 0)
#define FWD_H_DROP(NAME, D, BN, WGS, STAGES, OVERLAP, SW, PP, MINB, HR)                            \
    extern "C" __global__ void __launch_bounds__(128 * WGS, MINB) NAME(                            \
        const act_t* Q, const act_t* K, const act_t* V, act_t* O, float* LSE, int H, int KH, int T, \
        int S, i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 kst, i64 vsb, i64 vsh, i64 vst,     \
        i64 osb, i64 osh, i64 ost, float scale_log2, i64 doff, u32 k0, u32 k1, u32 thr, float dscale) { \
        flash_fwd_h<D, BN, WGS, STAGES, OVERLAP, SW, PP, true, HR>(                                \
            Q, K, V, O, LSE, H, KH, T, S, qsb, qsh, qst, ksb, ksh, kst, vsb, vsh, vst, osb, osh,   \
            ost, scale_log2, Drop{doff, k0, k1, thr, dscale});                                     \
    }

// name, D, BN, warpgroups, stages, overlap, swizzle, ping-pong, CTAs per SM asked of the register allocator:
// the shipped kernel per head dim (cuda_ops.FLASH_FWD_HOPPER). The other tiles, timed by
// benchmarks/kernels/flash_attn.py, are instantiated in benchmarks/kernels/flash_hopper_variants.cu.
FWD_H(flash_fwd_h64_bs, 64, 64, 2, 2, false, 1, false, 2)
FWD_H(flash_fwd_h128_bsp, 128, 128, 2, 2, false, 1, true, 1)      // ping-pong: +5-7% over h128_bs (H200, 2026-12-02)
// with attention dropout: the same tiles (cuda_ops.FLASH_FWD_HOPPER's name + "_drop"); the last
// argument, the hash's rounds (common.cuh's drop_word_r), is 2 in every shipped kernel
FWD_H_DROP(flash_fwd_h64_bs_drop, 64, 64, 2, 2, false, 1, false, 2, 2)
FWD_H_DROP(flash_fwd_h128_bsp_drop, 128, 128, 2, 2, false, 1, true, 1, 2)

// ------------------------------------------------------------------------------------------------
// Backward (DROP: with attention dropout, the forward's mask drawn again). The contract of
// flash_attn.cu's flash_bwd: the same arguments, flash_bwd_pre's delta and zeroed dQ accumulator, dQ added in
// fp32 (already scaled) in the same fixed order per query tile (the ordered reduction: a counter
// per PAIR tiles, key block nb adding after nb + 1 .. the last that sees them), dK and dV written
// (B, K, S, D) contiguous; heavy_first as there.
//
// One CTA = BN = 128 keys of one (b, kv-head), two warpgroups of 64 keys each; it loops over the
// query heads of the group and the query tiles of BM = 64 rows at or after the diagonal, Q / dO /
// lse / delta double buffered through cp.async, every tile in the forward's 128-byte swizzle
// (Lay<D, 1>). Per tile, warpgroup w (keys K_w, V_w: its 64 rows of the CTA's K and V tiles):
//   S^T = K_w Q^T, dP^T = V_w dO^T       ss, 64 keys x BM queries, both operands K-major
//   P^T = exp2(S^T scale_log2 - lse), masked; dS^T = P^T (dP^T - delta)      in registers
//   dV_w += P^T dO, dK_w += dS^T Q       rs: A = P^T / dS^T from the registers (the forward's
//                                        trick), B = dO / Q read MN-major (as the forward's V)
//   dS -> shared memory, queries x keys (Lay<BN, 1>, K-major), both warpgroups', then
//   dQ_w = dS[:, keys of w] K_w          ss, BM x D over w's 64 keys, B = K read MN-major
// and the two partial dQ_w are added in shared memory (warpgroup 0 finishes rows 0-31, 1 rows
// 32-63; the sum p0 + p1 is the same bits whichever finishes) and added to the accumulator.
// Every product is waited for at once; the dQ product is issued behind the dV / dK products.
// MODE (56 and 256 ship, the others are timing studies in benchmarks/kernels/flash_hopper_variants.cu): bit 0 skips the
// ordered reduction's wait (dQ's bits then vary), bit 1 leaves the dQ product and its adds out, bit 2
// keeps the product but leaves the exchange and the adds out (dQ then wrong); bit 5 adds with
// red.v4 after a lane swap instead of float2 atomics (the same bits, seen on an H100). Bit 3 defers a tile's
// adds to the next tile, behind its score products (the sums kept in the dQ registers; with bit 4
// as well, in shared memory, where the partial sums were exchanged: for D = 128, whose registers
// are spent). (Bit 6, the staged sums added by the bulk copy engine a row at a time, gave the same
// bits 22-26% slower at D = 64 on an H100 and was taken out: benchmarks/README.md.) Bit 8 (SPLIT,
// shipped at D = 128) splits the dQ product by columns instead of keys: warpgroup w makes dQ's
// columns w D / 2 .. (w + 1) D / 2 over all BN keys (dS read whole, K's columns from the B
// descriptor's start), so neither the exchange nor the owners: every thread adds its own sums,
// and a thread holds D / 4 dQ registers instead of D / 2. Its sums run over the keys in another
// order: its own bits, the same every run. (Its adds deferred in registers, bit 3, lost 18% at
// D = 64 and spilled at 128: taken out.)
template <int D, int BM, int MODE = 0, bool DROP = false, int HR = 2>
__device__ __forceinline__ void flash_bwd_h(
    const act_t* __restrict__ Q, const act_t* __restrict__ Kg, const act_t* __restrict__ Vg,
    const act_t* __restrict__ dO, const float* __restrict__ LSE, const float* __restrict__ Delta,
    float* __restrict__ dQacc, int* __restrict__ dQsem, act_t* __restrict__ dK, act_t* __restrict__ dV,
    int H, int KH, int T, int S,
    i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 kst, i64 vsb, i64 vsh, i64 vst,
    i64 dsb, i64 dsh, i64 dst, float scale, float scale_log2, int heavy_first,
    Drop dr = Drop{0, 0u, 0u, 0u, 0.f}) {
    constexpr int BN = 128, NT = 256, PAIR = 2;
    constexpr int TK = BN * D * 2, TQ = BM * D * 2;   // bytes of a K / V tile, of a Q / dO tile
    static_assert(BM == 64, "the dQ product's rows are one wgmma's M");
    using L = Lay<D, 1>;
    using LS = Lay<BN, 1>;                            // dS: BM rows of BN keys
    extern __shared__ __align__(128) unsigned char smem_raw[];   // 1024 bytes more than used
    unsigned char* sK = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);   // [BN][D]
    unsigned char* sV = sK + TK;                      // [BN][D]
    unsigned char* sQ = sV + TK;                      // [2][BM][D]
    unsigned char* sdO = sQ + 2 * TQ;                 // [2][BM][D]
    unsigned char* sdS = sdO + 2 * TQ;                // [BM][BN]
    constexpr bool DEFER = (MODE & 8) != 0, STAGED = (MODE & 16) != 0;
    constexpr bool PIPE = (MODE & 128) != 0;
    static_assert(!PIPE || (MODE & ~(128 | 32)) == 0, "PIPE goes alone (or with the v4 adds)");
    // SPLIT: each warpgroup makes D / 2 columns of dQ over all BN keys (no exchange, every thread adds)
    constexpr bool SPLIT = (MODE & 256) != 0;
    static_assert(!SPLIT || (MODE & ~(256 | 32)) == 0, "SPLIT goes alone (or with the v4 adds)");
    constexpr int NQ = SPLIT ? D / 4 : D / 2;         // dQ accumulator registers a thread
    constexpr int NC = SPLIT ? D / 2 : D;             // dQ columns a warpgroup makes
    // [2 row halves][D / 2][64 threads]; PIPE: two of them (the owners' own partial sums after the
    // partners')
    // (cuda_ops._hopper_bwd_smem's `exchange` floats: the study variants' sizes in flash_attn.py)
    float* sX = reinterpret_cast<float*>(sdS + BM * BN * 2);
    float* sL = sX + (PIPE ? 128 * D : SPLIT ? 0 : 64 * D);   // [2][BM] lse * log2e
    float* sDl = sL + 2 * BM;                         // [2][BM] delta

    const int nkb = gridDim.x;
    const int bk = blockIdx.y, nb = heavy_first ? blockIdx.x : nkb - 1 - blockIdx.x;
    const int b = bk / KH, kh = bk % KH, G = H / KH;
    const int n0 = nb * BN, offset = S - T;
    const act_t* k = Kg + b * ksb + kh * ksh;
    const act_t* v = Vg + b * vsb + kh * vsh;
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int first = max(0, n0 - offset) / BM;
    const int nmt = (T + BM - 1) / BM - first;
    if (nmt <= 0) {   // no query sees these keys (cannot happen when S == T): zero grads
        zero_key_grads<BN, D, NT>(dK, dV, ((i64)b * KH + kh) * S, n0, S);
        return;
    }
    const int iters = G * nmt;
    const int nqt = (T + BM - 1) / BM, nct = (T + BM * PAIR - 1) / (BM * PAIR);   // query tiles, counters

    auto load_stage = [&](int it, int st) {
        int hq = kh * G + it / nmt, m0 = (first + it % nmt) * BM;
        L::template load<BM, NT>(sQ + st * TQ, Q + b * qsb + hq * qsh, qst, m0, T);
        L::template load<BM, NT>(sdO + st * TQ, dO + b * dsb + hq * dsh, dst, m0, T);
        for (int i = threadIdx.x; i < BM; i += NT) {   // lse (natural log; a row past T: +inf, P = 0)
            int r = m0 + i;
            i64 idx = ((i64)b * H + hq) * T + r;
            if (r < T) {
                cp_async4(sL + st * BM + i, LSE + idx);
                cp_async4(sDl + st * BM + i, Delta + idx);
            } else {
                sL[st * BM + i] = INFINITY;
                sDl[st * BM + i] = 0.f;
            }
        }
    };

    L::template load<BN, NT>(sK, k, kst, n0, S);
    L::template load<BN, NT>(sV, v, vst, n0, S);
    load_stage(0, 0);
    cp_commit();

    float dk[D / 2], dv[D / 2], s[BM / 2], dp[BM / 2], dq[NQ];
#pragma unroll
    for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.f;
#pragma unroll
    for (int i = 0; i < NQ; i++) dq[i] = 0.f;
#pragma unroll
    for (int i = 0; i < BM / 2; i++) s[i] = dp[i] = 0.f;   // overwritten (acc = 0); keeps them defined
    const u64 ak = L::qk(sK + L::rows_at(wg * 64, BN), BN), av = L::qk(sV + L::rows_at(wg * 64, BN), BN);
    const int key0 = n0 + wg * 64 + warp * 16 + g;   // this thread's keys: key0 (e < 2), key0 + 8

    int* pending = nullptr;   // thread 0: the counter this block has still to advance
    const int half = warp / 2;                 // the dQ rows' half a warp finishes (warpgroup half)
    // the exchange: a thread of the other warpgroup's half writes here what this one adds
    float* x = sX + half * (D / 2) * 64 + (warp % 2) * 32 + lane;
    const bool owner = half == wg;             // (warps 0, 1 of warpgroup 0; 2, 3 of warpgroup 1)
    int p_m0 = -1, p_hq = 0, p_want = 0;       // DEFER: the tile whose adds are still to come
    bool p_first = false, p_last = false;
    int* p_sem = nullptr;
    int seen = 0;
    // thread 0: wait until the counter says the key blocks before this one have added (a relaxed
    // poll, then the fence: the acquire of their release)
    auto wait_turn = [&](int want_, int* sem_) {
        while (seen != want_) {
            __nanosleep(32);
            seen = ld_relaxed(sem_);
        }
        fence_acq_rel();
    };
    // an owner's rows of query tile m0_ (head hq_) added to the accumulator; register j's sum is
    // dq[j] + x[j * 64] (the partner's half from the exchange), dq[j] alone (from_x false) or x
    // alone (from_dq false). Not a generic lambda: NVRTC takes one (a template) for host code
    auto val = [&](int j, bool from_dq, bool from_x) {
        return from_dq && from_x ? dq[j] + x[j * 64] : (from_dq ? dq[j] : x[j * 64]);
    };
    // Each lane adds its two columns of both rows, float2 atomics. MODE bit 5 (shipped at D = 64,
    // +2.6-4.3% on an H100): lanes t and t ^ 1 swap halves so that the even one holds 4 columns of row g,
    // the odd one 4 of row g + 8, and each adds them with one red.global.add.v4.f32: half the
    // reductions, the same values added to the same elements (the same bits).
    // (SPLIT: columns c0 .. c0 + D / 2 of the warpgroup's own)
    const int c0 = SPLIT ? wg * (D / 2) : 0;
    auto add_rows = [&](int m0_, int hq_, bool from_dq, bool from_x) {
        if constexpr ((MODE & 32) == 0) {
#pragma unroll
            for (int rh = 0; rh < 2; rh++) {
                const int r = m0_ + warp * 16 + g + rh * 8;
                if (r < T) {
                    float* dstp = dQacc + (((i64)b * H + hq_) * T + r) * D + c0 + 2 * t;
#pragma unroll
                    for (int i = 0; i < NC / 8; i++)
                        atomicAdd(reinterpret_cast<float2*>(dstp + i * 8),
                                  make_float2(val(4 * i + 2 * rh, from_dq, from_x) * scale,
                                              val(4 * i + 2 * rh + 1, from_dq, from_x) * scale));
                }
            }
        } else {
            const int rh = t & 1;                 // my row: g (even lane) or g + 8 (odd)
            const int r = m0_ + warp * 16 + g + rh * 8;
            float* dstp = dQacc + (((i64)b * H + hq_) * T + r) * D + c0 + 4 * (t >> 1);
#pragma unroll
            for (int i = 0; i < NC / 8; i++) {
                // mine: row rh, columns 8 i + 2 t, + 1; the partner's for my row come back for mine of its
                const float m0v = val(4 * i + 2 * rh, from_dq, from_x) * scale;
                const float m1v = val(4 * i + 2 * rh + 1, from_dq, from_x) * scale;
                const float o0 = val(4 * i + 2 * (1 - rh), from_dq, from_x) * scale;
                const float o1 = val(4 * i + 2 * (1 - rh) + 1, from_dq, from_x) * scale;
                const float p0 = __shfl_xor_sync(0xffffffffu, o0, 1);
                const float p1 = __shfl_xor_sync(0xffffffffu, o1, 1);
                if (r < T)
                    red_add_v4(dstp + i * 8, rh ? p0 : m0v, rh ? p1 : m1v, rh ? m0v : p0, rh ? m1v : p1);
            }
        }
    };
    // PIPE: the tile whose dQ product is in flight past its iteration (finished behind the next
    // tile's score products)
    int q_m0 = -1, q_hq = 0, q_want = 0;
    bool q_first = false, q_last = false;
    int* q_sem = nullptr;
    // PIPE: that tile's dQ, its product complete: the exchange, the owners' sums and their ordered
    // adds (thread 0 reads the counter here: `seen` may hold another tile's by now)
    // Every thread stores its dq (owners into the second buffer): the accumulator registers are
    // not touched in a divergent path while the scores' products are in flight (ptxas would
    // serialize every wgmma, C7518); the owners then add the two in shared memory (the same sum)
    auto store_dq = [&]() {   // (unconditional: on the first tile a harmless store of zeros)
        float* mine = x + (owner ? 64 * D : 0);
#pragma unroll
        for (int j = 0; j < NQ; j++) mine[j * 64] = dq[j];
    };
    auto finish_dq = [&]() {
        __syncthreads();
        if (owner) {
#pragma unroll
            for (int j = 0; j < D / 2; j++) x[j * 64] += x[64 * D + j * 64];   // partner's + mine
            if (threadIdx.x == 0 && (MODE & 1) == 0 && q_first) {
                seen = ld_relaxed(q_sem);
                wait_turn(q_want, q_sem);
            }
            asm volatile("bar.sync 1, 128;\n" ::: "memory");
            add_rows(q_m0, q_hq, false, true);
        }
        if (threadIdx.x == 0 && q_last) pending = q_sem;   // released past the next barrier
    };
    // DEFER: the owners add the previous tile's sums in order: thread 0 waits, the owners' barrier
    // passes it on
    auto add_prev = [&]() {
        if (!owner) return;
        if (threadIdx.x == 0 && (MODE & 1) == 0 && p_first) wait_turn(p_want, p_sem);
        asm volatile("bar.sync 1, 128;\n" ::: "memory");
        add_rows(p_m0, p_hq, !STAGED, STAGED);
    };
    for (int it = 0; it < iters; it++) {
        const int st = it & 1;
        const int hq = kh * G + it / nmt, m0 = (first + it % nmt) * BM;
        cp_wait<0>();          // this tile's Q, dO, lse, delta
        fence_proxy_async();   // the cp.async writes, read next by the tensor cores
        __syncthreads();       // ... and every thread's adds of the last tile issued
        if (pending != nullptr) {   // (thread 0) their release, off the adds' path
            red_release(pending, 1);
            pending = nullptr;
        }
        if (it + 1 < iters) {  // the next tile's loads, in flight during this one
            load_stage(it + 1, st ^ 1);
            cp_commit();
        }
        // this tile's counter: the key blocks nb + 1 .. the last that sees the tile add before
        // this one; read now, waited on before the adds
        const int ti = m0 / BM, lt = min(ti / PAIR * PAIR + PAIR - 1, nqt - 1);
        int* sem = dQsem + ((i64)b * H + hq) * nct + ti / PAIR;
        const bool seg_first = ti % PAIR == 0 || it % nmt == 0;
        if (!DEFER && !PIPE && threadIdx.x == 0 && (MODE & 1) == 0 && seg_first) seen = ld_relaxed(sem);
        const int want = min(nkb - 1, ((lt + 1) * BM + offset - 1) / BN) - nb;
        const bool seg_last = ti % PAIR == PAIR - 1 || it % nmt == nmt - 1;
        const unsigned char* cQ = sQ + st * TQ;
        const unsigned char* cdO = sdO + st * TQ;
        const float* cL = sL + st * BM;
        const float* cDl = sDl + st * BM;

        // S^T = K_w Q^T and dP^T = V_w dO^T
        {
            const u64 bq = L::qk(cQ, BM), bo = L::qk(cdO, BM);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                Wg<BM>::template ss<0>(s, ak + (L::qk_step(kk, BN) >> 4), bq + (L::qk_step(kk, BM) >> 4), kk);
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                Wg<BM>::template ss<0>(dp, av + (L::qk_step(kk, BN) >> 4), bo + (L::qk_step(kk, BM) >> 4), kk);
            wgmma_commit();
            if constexpr (DEFER) {
                if (p_m0 >= 0) add_prev();
            }
            if constexpr (PIPE) {   // the last tile's dV, dK and dQ products done; these scores still in flight
                wgmma_wait<1>();
                fence_regs(dq);
                store_dq();
                if (q_m0 >= 0) finish_dq();
            }
            wgmma_wait<0>();
            fence_regs(s);
            fence_regs(dp);
        }
        // P^T, dS^T; register 4 i + e: key key0 + 8 (e / 2), query m0 + 8 i + 2 t + (e % 2). With
        // dropout (the forward's mask Z, drawn again): dV takes (P Z)^T, dS^T = P^T (Z dP^T - delta)
        const bool need_mask = (n0 + BN > S) || (n0 + BN - 1 > m0 + offset);
        const i64 drow = ((i64)b * H + hq) * T + m0;   // query m0's row: element off + (drow + qc) S + key
#pragma unroll
        for (int i = 0; i < BM / 8; i++) {
            float2 l2 = *reinterpret_cast<const float2*>(cL + 8 * i + 2 * t);
            l2.x *= LOG2E;
            l2.y *= LOG2E;
            const float2 d2 = *reinterpret_cast<const float2*>(cDl + 8 * i + 2 * t);
            float z[4];
            if constexpr (DROP)
                drop_bwd_frag<HR>(z, dr.off + (drow + 8 * i) * S, S, key0 - g, lane, ((dr.off | (i64)S) & 3) == 0, dr);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qc = 8 * i + 2 * t + (e & 1), key = key0 + (e >> 1) * 8;
                float p = exp2f(s[4 * i + e] * scale_log2 - ((e & 1) ? l2.y : l2.x));
                if (need_mask && (key >= S || key > m0 + qc + offset)) p = 0.f;
                if constexpr (DROP) {
                    s[4 * i + e] = p * z[e];
                    dp[4 * i + e] = p * (z[e] * dp[4 * i + e] - ((e & 1) ? d2.y : d2.x));
                } else {
                    s[4 * i + e] = p;
                    dp[4 * i + e] = p * (dp[4 * i + e] - ((e & 1) ? d2.y : d2.x));
                }
            }
        }
        u32 pa[BM / 16][4], da[BM / 16][4];
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                pa[kk][j] = pack2(s[8 * kk + 2 * j], s[8 * kk + 2 * j + 1]);
                da[kk][j] = pack2(dp[8 * kk + 2 * j], dp[8 * kk + 2 * j + 1]);
            }
        // dS (query r, key c) at atom c / 64, row r, 16-byte chunk ((c % 64) / 8) ^ (r % 8)
#pragma unroll
        for (int i = 0; i < BM / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = 8 * i + 2 * t + (e & 1);
                const int off = wg * BM * 128 + r * 128 + (((2 * warp + (e >> 1)) ^ (r % 8)) * 16) + g * 2;
                *reinterpret_cast<act_t*>(sdS + off) = from_f(dp[4 * i + e]);
            }
        fence_proxy_async();   // dS, read next by the tensor cores
        // dV_w += P^T dO, dK_w += dS^T Q (16 queries a product)
        {
            const u64 bo = L::v(cdO, BM), bq = L::v(cQ, BM);
            fence_regs(dv);
            fence_regs(dk);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BM / 16; kk++)
                Wg<D>::template rs<1>(dv, pa[kk], bo + (L::v_step(kk) >> 4), 1);
#pragma unroll
            for (int kk = 0; kk < BM / 16; kk++)
                Wg<D>::template rs<1>(dk, da[kk], bq + (L::v_step(kk) >> 4), 1);
            wgmma_commit();
        }
        if constexpr ((MODE & 2) != 0) {
            wgmma_wait<0>();
            fence_regs(dv);
            fence_regs(dk);
            continue;
        }
        __syncthreads();   // both warpgroups' dS in shared memory
        // dQ_w = dS[:, keys of w] K_w (16 keys a product); SPLIT: dQ[:, c0 ..] = dS K[:, c0 ..] over
        // all BN keys, B = K's columns c0 .. c0 + D / 2 (at D = 64 the second half of the 128-byte
        // swizzle atom's rows: a start 64 bytes in, the swizzle being of the address bits)
        {
            const u64 as = LS::qk(sdS, BM);
            fence_regs(dq);
            wgmma_fence();
            if constexpr (SPLIT) {
                const u64 bk_ = L::v(sK + (c0 / 64) * BN * 128 + (c0 % 64) * 2, BN);
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++)
                    Wg<D / 2>::template ss<1>(dq, as + (LS::qk_step(kk, BM) >> 4), bk_ + (L::v_step(kk) >> 4), kk);
            } else {
                const u64 bk_ = L::v(sK, BN);
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    Wg<D>::template ss<1>(dq, as + (LS::qk_step(4 * wg + kk, BM) >> 4), bk_ + (L::v_step(4 * wg + kk) >> 4), kk);
            }
            wgmma_commit();
            if constexpr (PIPE) {   // waited for behind the next tile's score products
                wgmma_wait<1>();     // dV, dK done: they read this stage's Q and dO, loaded over next
                fence_regs(dv);
                fence_regs(dk);
                q_m0 = m0, q_hq = hq, q_want = want, q_first = seg_first, q_last = seg_last, q_sem = sem;
                continue;
            }
            if (DEFER && threadIdx.x == 0 && p_m0 >= 0 && p_last)
                red_release(p_sem, 1);   // the owners' adds of the last tile: all before the dS barrier
            wgmma_wait<0>();
            fence_regs(dq);
            fence_regs(dv);
            fence_regs(dk);
        }
        if constexpr (SPLIT) {   // no partial sums: this warpgroup's columns are complete
            if (threadIdx.x == 0 && (MODE & 1) == 0 && seg_first) wait_turn(want, sem);
            __syncthreads();
            add_rows(m0, hq, true, false);
            if (threadIdx.x == 0 && seg_last) pending = sem;
            continue;
        }
        // the partial sums: rows 0-31 (warps 0, 1 of a warpgroup) finish in warpgroup 0, 32-63 in 1
        if (!owner) {
#pragma unroll
            for (int j = 0; j < NQ; j++) x[j * 64] = dq[j];
        }
        if constexpr ((MODE & 4) != 0) continue;
        if constexpr (DEFER) {
            if (threadIdx.x == 0 && seg_first) seen = ld_relaxed(sem);   // waited on next tile
            __syncthreads();
            if (owner) {
#pragma unroll
                for (int j = 0; j < NQ; j++) {
                    if (STAGED) x[j * 64] += dq[j];   // p1 + p0 = p0 + p1: the same bits
                    else dq[j] += x[j * 64];
                }
            }
            p_m0 = m0, p_hq = hq, p_want = want, p_first = seg_first, p_last = seg_last, p_sem = sem;
            continue;
        }
        if (threadIdx.x == 0 && (MODE & 1) == 0 && seg_first) wait_turn(want, sem);   // a segment's first tile
        __syncthreads();
        if (owner) add_rows(m0, hq, true, true);
        if (threadIdx.x == 0 && seg_last)
            pending = sem;   // this block's adds of the segment's tiles: released past the next barrier
    }
    if constexpr (PIPE) {
        wgmma_wait<0>();
        fence_regs(dq);
        fence_regs(dv);
        fence_regs(dk);
        // the tile before the last may have ended a segment in the last iteration: released here,
        // before the last tile's wait (another block may need it to reach the turn waited for)
        __syncthreads();
        if (threadIdx.x == 0 && pending != nullptr) {
            red_release(pending, 1);
            pending = nullptr;
        }
        store_dq();
        if (q_m0 >= 0) finish_dq();
    }
    if constexpr (DEFER) {
        if (p_m0 >= 0) {
            add_prev();
            pending = p_sem;   // the last tile ends its segment
        }
    }
    __syncthreads();
    if (threadIdx.x == 0 && pending != nullptr) red_release(pending, 1);
    // dK (scaled) and dV, (B, K, S, D) contiguous
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
        const int key = key0 + rh * 8;
        if (key < S) {
            const i64 base = (((i64)b * KH + kh) * S + key) * D + 2 * t;
#pragma unroll
            for (int i = 0; i < D / 8; i++) {
                *reinterpret_cast<act2_t*>(dK + base + i * 8) = from_f2(dk[4 * i + 2 * rh] * scale, dk[4 * i + 2 * rh + 1] * scale);
                *reinterpret_cast<act2_t*>(dV + base + i * 8) = from_f2(dv[4 * i + 2 * rh], dv[4 * i + 2 * rh + 1]);
            }
        }
    }
}

#define BWD_H(NAME, D, BM, MODE)                                                                   \
    extern "C" __global__ void __launch_bounds__(256, 1) NAME(                                     \
        const act_t* Q, const act_t* K, const act_t* V, const act_t* dO, const float* LSE,        \
        const float* Delta, float* dQacc, int* dQsem, act_t* dK, act_t* dV, int H, int KH, int T,  \
        int S, i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 kst, i64 vsb, i64 vsh, i64 vst,    \
        i64 dsb, i64 dsh, i64 dst, float scale, float scale_log2, int heavy_first) {               \
        flash_bwd_h<D, BM, MODE>(Q, K, V, dO, LSE, Delta, dQacc, dQsem, dK, dV, H, KH, T, S,       \
                           qsb, qsh, qst, ksb, ksh, kst, vsb, vsh, vst, dsb, dsh, dst, scale,      \
                           scale_log2, heavy_first);                                               \
    }
// the same with attention dropout (common.cuh's Drop; cuda_ops launches it when drop= has p > 0)
#define BWD_H_DROP(NAME, D, BM, MODE, HR)                                                          \
    extern "C" __global__ void __launch_bounds__(256, 1) NAME(                                     \
        const act_t* Q, const act_t* K, const act_t* V, const act_t* dO, const float* LSE,        \
        const float* Delta, float* dQacc, int* dQsem, act_t* dK, act_t* dV, int H, int KH, int T,  \
        int S, i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 kst, i64 vsb, i64 vsh, i64 vst,    \
        i64 dsb, i64 dsh, i64 dst, float scale, float scale_log2, int heavy_first, i64 doff,      \
        u32 k0, u32 k1, u32 thr, float dscale) {                                                   \
        flash_bwd_h<D, BM, MODE, true, HR>(Q, K, V, dO, LSE, Delta, dQacc, dQsem, dK, dV, H, KH, T, S, \
                           qsb, qsh, qst, ksb, ksh, kst, vsb, vsh, vst, dsb, dsh, dst, scale,      \
                           scale_log2, heavy_first, Drop{doff, k0, k1, thr, dscale});              \
    }

// name, D, BM, MODE: the shipped backward per head dim (cuda_ops.FLASH_BWD_HOPPER). At D = 64 the
// staged deferred adds (MODE 24) made as red.global.add.v4.f32 after a lane swap (MODE 32: half the
// reductions, the same bytes): +4.3% / +3.8% / +2.6% at (16,12,1024,64) / (16,12,4096,64) /
// (32,12,1024,64) over the staged adds alone, which had gained +4.5% / +0.4% over the immediate
// adds (H100, benchmarks/README.md, "h_pipe run, h_v4 shipped"); the split dQ product lost there
// (-1% to -6%). At D = 128 the deferred forms and the lane swap lost (h_v4 -28-31%) and the split
// dQ product with immediate float2 adds (MODE 256) won: +6.9% / +6.0% over the immediate adds at
// (16,12,1024,128) / (16,12,4096,128) (H100, thirtieth session; 250 registers against 255).
BWD_H(flash_bwd_h64, 64, 64, 56)
BWD_H(flash_bwd_h128, 128, 64, 256)
// with attention dropout: the same tiles (cuda_ops.FLASH_BWD_HOPPER's name + "_drop")
BWD_H_DROP(flash_bwd_h64_drop, 64, 64, 56, 2)
BWD_H_DROP(flash_bwd_h128_drop, 128, 64, 256, 2)

#endif
