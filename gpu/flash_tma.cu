// The forward fed by the tensor memory accelerator (issue 28): not a module alone but the second
// part of the Hopper module, after gpu/flash_hopper.cu, whose helpers it uses (Lay, Wg, the wgmma
// wrappers): cuda_ops._hopper_module compiles the two as one source (gpu_source.tma_source).
#if HAS_MMA

// ------------------------------------------------------------------------------------------------
// Forward fed by the tensor memory accelerator, with a producer warp (FlashAttention-3's warp
// specialisation; issue 28). The same contract and the same arithmetic per row as flash_fwd_h (so
// at equal BN the same bits), but no thread of the math warpgroups loads anything and no barrier
// joins them: one lane of a producer warp (the CTA's last warp) issues every copy as a bulk tensor
// copy (cp.async.bulk.tensor, boxes of 64 columns x rows in the 128-byte swizzle, Lay<D, 1>'s
// layout, rows past T or S filled with zeros by the copy engine), each completing on an mbarrier
// ("full", one per stage, with the bytes it expects); each of the CW math warpgroups (64 query rows)
// waits on a stage's full barrier, reads it, and arrives on its "empty" barrier (every math thread
// arrives once per tile), whose completion lets the producer refill the stage. A warpgroup past its
// last tile (the diagonal) still waits for each tile's data before it arrives, so its arrivals fall
// in that tile's phase. The three tensor maps (CUtensorMap, 128 bytes) come by value
// (__grid_constant__): q as (D, T, H, B), k and v as (D, S, K, B), strides from the views
// (cuda_ops._tma_map). b0: the batch row of grid row 0 (a launch in slices of the batch).
struct __align__(64) TmaMap { unsigned long long w[16]; };

__device__ __forceinline__ void mbar_init(u64* b, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(u64* b, u32 bytes) {   // an arrival that also expects bytes
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u64* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(u64* b, u32 parity) {   // until the phase of this parity completes
    asm volatile("{\n.reg .pred done;\nwait_again:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_again;\n}\n" :: "r"(smem_u32(b)), "r"(parity) : "memory");
}
// a box of the tensor map `map` at coordinates (c0, c1, c2, c3) into shared memory at dst, its bytes
// counted on the barrier bar
__device__ __forceinline__ void tma_load4(void* dst, const TmaMap* map, u64* bar, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
                    "r"(smem_u32(bar)) : "memory");
}

template <int D, int BN, int CW, int STAGES, bool DROP = false, int HR = 2>
__device__ __forceinline__ void flash_fwd_w(
    const TmaMap& mq, const TmaMap& mk, const TmaMap& mv, act_t* __restrict__ O, float* __restrict__ LSE,
    int H, int KH, int T, int S, int b0, i64 osb, i64 osh, i64 ost, float scale_log2,
    Drop dr = Drop{0, 0u, 0u, 0u, 0.f}) {
    constexpr int BM = 64 * CW, TILE = BN * D * 2, QB = BM * D * 2, A = D / 64;   // A: 64-column atoms
    using L = Lay<D, 1>;
    extern __shared__ __align__(128) unsigned char smem_raw[];   // 1024 bytes more than used
    unsigned char* sQ = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);   // [BM][D]
    unsigned char* sK = sQ + QB;                  // [STAGES][BN][D]
    unsigned char* sV = sK + STAGES * TILE;       // [STAGES][BN][D]
    u64* qbar = reinterpret_cast<u64*>(sV + STAGES * TILE);
    u64* full = qbar + 1;                         // [STAGES]
    u64* empty = full + STAGES;                   // [STAGES]

    const int mtile = gridDim.x - 1 - blockIdx.x;    // heaviest (last) query tiles first
    const int bh = blockIdx.y, b = b0 + bh / H, h = bh % H, kh = h / (H / KH);
    const int m0 = mtile * BM, offset = S - T;
    const int ntiles = (min(S, m0 + BM + offset) + BN - 1) / BN;            // tiles the CTA loads
    if (threadIdx.x == 0) {
        mbar_init(qbar, 1);
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full + s, 1);
            mbar_init(empty + s, 128 * CW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x >= 128 * CW) {                // the producer warp
        if (threadIdx.x == 128 * CW) {
            mbar_expect(qbar, QB);
#pragma unroll
            for (int a = 0; a < A; a++) tma_load4(sQ + a * BM * 128, &mq, qbar, a * 64, m0, h, b);
            for (int j = 0; j < ntiles; j++) {
                const int st = j % STAGES;
                if (j >= STAGES) mbar_wait(empty + st, ((j / STAGES) - 1) & 1);   // its last readers are done
                mbar_expect(full + st, 2 * TILE);
#pragma unroll
                for (int a = 0; a < A; a++) {
                    tma_load4(sK + st * TILE + a * BN * 128, &mk, full + st, a * 64, j * BN, kh, b);
                    tma_load4(sV + st * TILE + a * BN * 128, &mv, full + st, a * 64, j * BN, kh, b);
                }
            }
        }
        return;
    }
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int wrow = wg * 64 + warp * 16;            // this warp's first row in the CTA's tile
    const int wtiles = (min(S, m0 + wg * 64 + 64 + offset) + BN - 1) / BN;  // tiles this warpgroup sees

    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    const u64 dq = L::qk(sQ + L::rows_at(wg * 64, BM), BM);
    float s[BN / 2];
    mbar_wait(qbar, 0);
    for (int j = 0; j < ntiles; j++) {
        const int st = j % STAGES;
        mbar_wait(full + st, (j / STAGES) & 1);
        if (j < wtiles) {
            const int n0 = j * BN;
            const u64 dk = L::qk(sK + st * TILE, BN);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)   // 16 columns of Q and K
                Wg<BN>::template ss<0>(s, dq + (L::qk_step(kk, BM) >> 4), dk + (L::qk_step(kk, BN) >> 4), kk);
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(s);
            fwd_tile<D, BN, 1, DROP, HR>(s, o, mrow, lrow, sV + st * TILE, n0, m0 + wrow, g, t, S, offset,
                                         scale_log2, bh, T, dr);
        }
        mbar_arrive(empty + st);   // this thread is done with the stage
    }
    fwd_finish<D>(o, mrow, lrow, O, LSE, b, h, H, T, m0 + wrow + g, osb, osh, ost, t);
}

#define FWD_W(NAME, D, BN, CW, STAGES, MINB)                                                       \
    extern "C" __global__ void __launch_bounds__(128 * CW + 32, MINB) NAME(                        \
        const __grid_constant__ TmaMap mq, const __grid_constant__ TmaMap mk,                      \
        const __grid_constant__ TmaMap mv, act_t* O, float* LSE, int H, int KH, int T, int S,      \
        int b0, i64 osb, i64 osh, i64 ost, float scale_log2) {                                      \
        flash_fwd_w<D, BN, CW, STAGES>(mq, mk, mv, O, LSE, H, KH, T, S, b0, osb, osh, ost, scale_log2); \
    }
// the same with attention dropout (common.cuh's Drop, the wgmma forward's mask bit for bit; dr.off
// counts from the launch's first batch row, as flash_fwd_h's): cuda_ops.TMA_DROP runs them
#define FWD_W_DROP(NAME, D, BN, CW, STAGES, MINB, HR)                                              \
    extern "C" __global__ void __launch_bounds__(128 * CW + 32, MINB) NAME(                        \
        const __grid_constant__ TmaMap mq, const __grid_constant__ TmaMap mk,                      \
        const __grid_constant__ TmaMap mv, act_t* O, float* LSE, int H, int KH, int T, int S,      \
        int b0, i64 osb, i64 osh, i64 ost, float scale_log2, i64 doff, u32 k0, u32 k1, u32 thr,    \
        float dscale) {                                                                             \
        flash_fwd_w<D, BN, CW, STAGES, true, HR>(mq, mk, mv, O, LSE, H, KH, T, S, b0, osb, osh, ost, \
                                                 scale_log2, Drop{doff, k0, k1, thr, dscale});     \
    }
// name, D, BN, math warpgroups, stages, CTAs per SM asked of the register allocator (cuda_ops.TMA_FWD_KERNELS)
FWD_W(flash_fwd_w64, 64, 64, 2, 3, 2)
FWD_W(flash_fwd_w64_n128, 64, 128, 2, 2, 1)
FWD_W(flash_fwd_w64_m192, 64, 128, 3, 2, 1)
FWD_W(flash_fwd_w128, 128, 128, 2, 2, 1)
FWD_W(flash_fwd_w128_n64, 128, 64, 2, 3, 1)
// with attention dropout (not yet run on a GPU: cuda_ops.TMA_DROP is off until their tests pass there)
FWD_W_DROP(flash_fwd_w64_drop, 64, 64, 2, 3, 2, 2)
FWD_W_DROP(flash_fwd_w128_drop, 128, 128, 2, 2, 1, 2)
#endif
