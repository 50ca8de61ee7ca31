// FlashAttention-2, forward and backward, on tensor cores (mma.sync m16n8k16, FP16 or BF16 in,
// FP32 accumulate), causal, grouped-query, head dims 32, 64 and 128, any T and S >= T.
//
// Layout: q (B, H, T, D), k/v (B, K, S, D), each given by (batch, head, row) strides in elements
// with the last dim contiguous, so strided views (a KV-cache slice, a (B, T, H, D) buffer seen as
// (B, H, T, D)) are used without copies. Query t sits at absolute position S - T + t and sees keys
// 0 .. S - T + t. Query head h uses key/value head h / (H / K).
//
// Forward: one CTA = BM = 16 * MT * NW query rows of one (b, h), each warp 16 * MT rows; loops
// over key tiles of BN keys with online softmax (base-2 exponentials, scale folded in), K/V tiles double
// buffered through cp.async; fully masked key tiles are never visited. Saves LSE (natural log).
// The score accumulator is reused in registers as the A operand of P @ V (FA2's layout trick).
//
// Backward: one CTA = BN = 16 * MT * NW keys of one (b, kv-head), each warp 16 * MT keys; loops over all query
// heads of the group and the query tiles (BM rows) at or after the diagonal, Q/dO/lse/delta double
// buffered. dK, dV accumulate in registers (no atomics); dQ accumulates in an fp32 buffer through
// red.global.add.v2.f32, already scaled: the fp32 accumulator is returned as dq
// (qkv_rope_backward reads fp32 dq). The adds into one query tile come in a fixed order, so the
// sums are the same bits every run: a counter per (b, h, query tile) says how many key blocks
// have added; key block nb adds once the blocks after it (nb + 1 .. the last that sees the tile)
// have, then counts itself (an ordered reduction, as CUTLASS's serial split-K). The last key
// blocks reach a tile first in their own loop (they start on the diagonal), so the wait is
// rarely felt; a block only waits on blocks of a higher index, which start no later, so the
// waits cannot deadlock.
//
// Only the kernels cuda_ops launches ship here (one forward and one backward per head dim); the
// other tile configurations, kept for study and timing, are in benchmarks/kernels/.
//
// Fragment layouts (PTX ISA, mma.m16n8k16): g = lane / 4, t = lane % 4;
//   A (16x16): a0 (g, 2t..2t+1) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..)
//   B (16x8):  b0 (k 2t..2t+1, n g) b1 (k 2t+8.., n g)
//   C (16x8):  c0,c1 (g, 2t..2t+1) c2,c3 (g+8, 2t..2t+1)
#include "common.cuh"

#if HAS_MMA

__device__ __forceinline__ void ldsm_x4(u32* r, const act_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}

__device__ __forceinline__ void ldsm_x4_t(u32* r, const act_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}

// rows [r0, r0 + R) of a (rows, D) matrix with row stride rs into smem (row stride SD);
// rows >= nrows are zero-filled.
template <int R, int D, int NT>
__device__ __forceinline__ void load_tile(act_t* s, const act_t* g, i64 rs, int r0, int nrows) {
    constexpr int SD = D + 8, CPR = D / 8;
#pragma unroll
    for (int i = threadIdx.x; i < R * CPR; i += NT) {
        int r = i / CPR, c = (i % CPR) * 8;
        bool ok = r0 + r < nrows;
        const act_t* src = g + (ok ? (i64)(r0 + r) * rs + c : 0);
        cp_async16(s + r * SD + c, src, ok);
    }
}

// ------------------------------------------------------------------------------------------------
// Forward. Each warp owns MT m-tiles of 16 query rows (BM = 16 * MT * NW rows per CTA), so every
// K/V fragment read from shared memory feeds MT tensor-core products. QREG keeps the Q fragments
// in registers for the whole CTA (head dim 64); otherwise they are re-read per key tile.
template <int D, int MT, int BN, int NW, bool QREG, bool DROP = false>
__device__ __forceinline__ void flash_fwd(
    const act_t* __restrict__ Q, const act_t* __restrict__ Kg, const act_t* __restrict__ Vg,
    act_t* __restrict__ O, float* __restrict__ LSE, int H, int KH, int T, int S,
    i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 kst, i64 vsb, i64 vsh, i64 vst,
    i64 osb, i64 osh, i64 ost, float scale_log2, Drop dr = Drop{0, 0u, 0u, 0u, 0.f}) {
    constexpr int BM = 16 * MT * NW, SD = D + 8, NT = 32 * NW;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    act_t* sQ = reinterpret_cast<act_t*>(smem_raw);
    act_t* sK = sQ + BM * SD;          // [2][BN][SD]
    act_t* sV = sK + 2 * BN * SD;      // [2][BN][SD]

    const int mtile = gridDim.x - 1 - blockIdx.x;    // heaviest (last) query tiles first
    const int bh = blockIdx.y, b = bh / H, h = bh % H, kh = h / (H / KH);
    const int m0 = mtile * BM, offset = S - T;
    const act_t* q = Q + b * qsb + h * qsh;
    const act_t* k = Kg + b * ksb + kh * ksh;
    const act_t* v = Vg + b * vsb + kh * vsh;
    const int kend = min(S, m0 + BM + offset);       // keys beyond are masked for every row
    const int ntiles = (kend + BN - 1) / BN;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

    load_tile<BM, D, NT>(sQ, q, qst, m0, T);
    load_tile<BN, D, NT>(sK, k, kst, 0, S);
    load_tile<BN, D, NT>(sV, v, vst, 0, S);
    cp_commit();

    float o[MT][D / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < D / 8; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
    float mrow[MT][2], lrow[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) { mrow[mt][0] = mrow[mt][1] = -INFINITY; lrow[mt][0] = lrow[mt][1] = 0.f; }
    u32 qf[QREG ? MT : 1][QREG ? D / 16 : 1][4];
    const int wrow = warp * 16 * MT;            // this warp's first row in the tile

    for (int j = 0; j < ntiles; j++) {
        const int st = j & 1;
        if (j + 1 < ntiles) {
            load_tile<BN, D, NT>(sK + (st ^ 1) * BN * SD, k, kst, (j + 1) * BN, S);
            load_tile<BN, D, NT>(sV + (st ^ 1) * BN * SD, v, vst, (j + 1) * BN, S);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        if (QREG && j == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++)
                    ldsm_x4(qf[QREG ? mt : 0][QREG ? kk : 0],
                            sQ + (wrow + mt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * SD + kk * 16 + (lane / 16) * 8);
        }
        const act_t* cK = sK + st * BN * SD;
        const act_t* cV = sV + st * BN * SD;
        float s[MT][BN / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < BN / 8; i++) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            u32 qa[QREG ? 1 : MT][4];
            if (!QREG) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    ldsm_x4(qa[QREG ? 0 : mt], sQ + (wrow + mt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * SD
                                                   + kk * 16 + (lane / 16) * 8);
            }
#pragma unroll
            for (int nn = 0; nn < BN / 16; nn++) {
                u32 bf[4];
                ldsm_x4(bf, cK + (nn * 16 + (lane % 8) + (lane / 16) * 8) * SD
                                + kk * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const u32* a = QREG ? qf[QREG ? mt : 0][QREG ? kk : 0] : qa[QREG ? 0 : mt];
                    mma16816(s[mt][2 * nn], a, bf[0], bf[1]);
                    mma16816(s[mt][2 * nn + 1], a, bf[2], bf[3]);
                }
            }
        }
        const int n0 = j * BN;
        if (n0 + BN > S || n0 + BN - 1 > m0 + offset) {   // tile touches the diagonal or the end
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int c = n0 + nt * 8 + 2 * t + (e & 1);
                        int r = m0 + wrow + mt * 16 + g + (e >> 1) * 8;
                        if (c >= S || c > r + offset) s[mt][nt][e] = -INFINITY;
                    }
        }
        // online softmax, two rows per thread and m-tile (g: e = 0,1; g + 8: e = 2,3)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int rh = 0; rh < 2; rh++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
                mx = fmaxf(mx, fmaxf(s[mt][nt][2 * rh], s[mt][nt][2 * rh + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float mnew = fmaxf(mrow[mt][rh], mx * scale_log2);
            float muse = mnew == -INFINITY ? 0.f : mnew;
            float alpha = exp2f(mrow[mt][rh] - muse);
            mrow[mt][rh] = mnew;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++) {
                float p0 = exp2f(s[mt][nt][2 * rh] * scale_log2 - muse);
                float p1 = exp2f(s[mt][nt][2 * rh + 1] * scale_log2 - muse);
                s[mt][nt][2 * rh] = p0; s[mt][nt][2 * rh + 1] = p1;
                sum += p0 + p1;
            }
            lrow[mt][rh] = lrow[mt][rh] * alpha + sum;
            if (DROP)   // after the row sum: l (and LSE) stay those of the undropped P
                drop_fwd_row<BN / 8>(s[mt], rh, dr.off + ((i64)bh * T + m0 + wrow + mt * 16 + g + rh * 8) * S + n0,
                                     t, ((dr.off | (i64)S) & 3) == 0, dr);
#pragma unroll
            for (int dn = 0; dn < D / 8; dn++) { o[mt][dn][2 * rh] *= alpha; o[mt][dn][2 * rh + 1] *= alpha; }
        }
        // O += P V
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            u32 pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                pa[mt][0] = pack2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pa[mt][1] = pack2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pa[mt][2] = pack2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pa[mt][3] = pack2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dn = 0; dn < D / 16; dn++) {
                u32 bf[4];
                ldsm_x4_t(bf, cV + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * SD
                                 + dn * 16 + (lane / 16) * 8);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816(o[mt][2 * dn], pa[mt], bf[0], bf[1]);
                    mma16816(o[mt][2 * dn + 1], pa[mt], bf[2], bf[3]);
                }
            }
        }
        __syncthreads();
    }
    // finish: divide by the row sums, write O and LSE
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
        float l = lrow[mt][rh];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        int r = m0 + wrow + mt * 16 + g + rh * 8;
        float inv = 1.f / l;
        if (r < T) {
            act_t* orow = O + b * osb + h * osh + (i64)r * ost;
#pragma unroll
            for (int dn = 0; dn < D / 8; dn++)
                *reinterpret_cast<act2_t*>(orow + dn * 8 + 2 * t) =
                    from_f2(o[mt][dn][2 * rh] * inv, o[mt][dn][2 * rh + 1] * inv);
            if (t == 0) LSE[((i64)b * H + h) * T + r] = (mrow[mt][rh] + log2f(l)) * LN2;
        }
    }
}

// ------------------------------------------------------------------------------------------------
// delta[b, h, t] = sum_d dO * O (fp32); zero the fp32 dQ accumulator row and, on a query tile's
// first row (t % bm == 0, bm = the backward's BM), the tile's counter dq_sem[b, h, t / bm]
// (B*H*ceil(T / bm) ints, then the backward's CTA ticket). One warp per row.
extern "C" __global__ void flash_bwd_pre(
    const act_t* __restrict__ dO, const act_t* __restrict__ O, float* __restrict__ delta,
    float* __restrict__ dq_acc, int* __restrict__ dq_sem, int bm, int H, int T, int D,
    i64 dsb, i64 dsh, i64 dst, i64 osb, i64 osh, i64 ost, long long rows) {
    i64 row = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = row % T; i64 bh = row / T; int h = bh % H; i64 b = bh / H;
    const act_t* d = dO + b * dsb + h * dsh + t * dst;
    const act_t* o = O + b * osb + h * osh + t * ost;
    float acc = 0.f;
    for (int c = lane * 2; c < D; c += 64) {
        float2 x = to_f2(*reinterpret_cast<const act2_t*>(d + c));
        float2 y = to_f2(*reinterpret_cast<const act2_t*>(o + c));
        acc += x.x * y.x + x.y * y.y;
        *reinterpret_cast<float2*>(dq_acc + row * D + c) = make_float2(0.f, 0.f);
    }
    acc = warp_sum(acc);
    if (lane == 0) delta[row] = acc;
    if (lane == 0 && t % bm == 0) dq_sem[bh * ((T + bm - 1) / bm) + t / bm] = 0;
    if (lane == 0 && row == 0) dq_sem[rows / T * ((T + bm - 1) / bm)] = 0;   // the CTA ticket
}

// Backward. Each warp owns MT m-tiles of 16 keys (BN = 16 * MT * NW keys per CTA): every Q / dO
// fragment read from shared memory feeds MT products, and dQ gets one add per BN keys.
// ORDER, the dQ adds: 1 = ordered (what ships): the counter read with acquire right before the
// adds, released (fence + add) right after them; 0 = unordered (the kernel before the ordered
// reduction, different bits from run to run), 3 = ordered with the release of a tile deferred into
// the next iteration and the counter read early (relaxed): both kept for timing in
// benchmarks/kernels/flash_variants.cu only. TICKET below. PAIR (ORDER 1): query tiles per
// counter: a block waits once, adds PAIR tiles' dQ, then counts itself, so PAIR times fewer waits
// and fences (each costs a round trip to L2); the block after it in the order reaches the same
// tiles BN / BM = 4 iterations later, so the wait is still rarely felt.
template <int D, int BM, int MT, int NW, int ORDER, int TICKET, int PAIR, bool DROP = false>
__device__ __forceinline__ void flash_bwd(
    const act_t* __restrict__ Q, const act_t* __restrict__ Kg, const act_t* __restrict__ Vg,
    const act_t* __restrict__ dO, const float* __restrict__ LSE, const float* __restrict__ Delta,
    float* __restrict__ dQacc, int* __restrict__ dQsem, act_t* __restrict__ dK, act_t* __restrict__ dV,
    int H, int KH, int T, int S,
    i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 kst, i64 vsb, i64 vsh, i64 vst,
    i64 dsb, i64 dsh, i64 dst, float scale, float scale_log2, int heavy_first,
    Drop dr = Drop{0, 0u, 0u, 0u, 0.f}) {
    constexpr int BN = 16 * MT * NW, SD = D + 8, SP = BM + 8, NT = 32 * NW;
    constexpr int RG = BM / 16, CG = NW / RG, DC = D / CG;   // dQ: row groups x column groups
    static_assert(PAIR == 1 || ORDER == 1, "several tiles per counter: ORDER 1 only");
    static_assert(RG * CG == NW && DC % 16 == 0, "dQ warp tiling");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    act_t* sK = reinterpret_cast<act_t*>(smem_raw);   // [BN][SD]
    act_t* sV = sK + BN * SD;                          // [BN][SD]
    act_t* sQ = sV + BN * SD;                          // [2][BM][SD]
    act_t* sdO = sQ + 2 * BM * SD;                     // [2][BM][SD]
    act_t* sdS = sdO + 2 * BM * SD;                    // [BN][SP]  dS^T
    float* sL = reinterpret_cast<float*>(sdS + BN * SP);   // [2][BM] lse * log2e
    float* sDl = sL + 2 * BM;                              // [2][BM] delta

    // The CTA's place, group by group (b, kv-head), each group's key blocks heaviest (nb = 0)
    // first or, when a group has more key blocks than surely fit on the GPU at once, lightest
    // first (then every block waits only on blocks that started before it). Same sums either
    // way. TICKET: places in the order CTAs really start (a counter), instead of blockIdx
    // (dispatched in index order in practice, not by promise).
    int ticket = blockIdx.y * gridDim.x + blockIdx.x;
    if (TICKET) {
        __shared__ int s_ticket;
        if (threadIdx.x == 0) s_ticket = atomicAdd(dQsem + (i64)(gridDim.y / KH) * H * ((T + BM * PAIR - 1) / (BM * PAIR)), 1);
        __syncthreads();
        ticket = s_ticket;
    }
    const int nkb = gridDim.x;
    const int bk = ticket / nkb, nb = heavy_first ? ticket % nkb : nkb - 1 - ticket % nkb;
    const int b = bk / KH, kh = bk % KH, G = H / KH;
    const int n0 = nb * BN, offset = S - T;
    const act_t* k = Kg + b * ksb + kh * ksh;
    const act_t* v = Vg + b * vsb + kh * vsh;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
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
        load_tile<BM, D, NT>(sQ + st * BM * SD, Q + b * qsb + hq * qsh, qst, m0, T);
        load_tile<BM, D, NT>(sdO + st * BM * SD, dO + b * dsb + hq * dsh, dst, m0, T);
        for (int i = threadIdx.x; i < BM; i += NT) {
            int r = m0 + i;
            i64 idx = ((i64)b * H + hq) * T + r;
            sL[st * BM + i] = r < T ? LSE[idx] * LOG2E : INFINITY;
            sDl[st * BM + i] = r < T ? Delta[idx] : 0.f;
        }
    };

    load_tile<BN, D, NT>(sK, k, kst, n0, S);
    load_tile<BN, D, NT>(sV, v, vst, n0, S);
    load_stage(0, 0);
    cp_commit();

    float dk[MT][D / 8][4], dv[MT][D / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < D / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) dk[mt][i][e] = dv[mt][i][e] = 0.f;
    const int wkey = warp * 16 * MT;            // this warp's first key in the tile

    for (int it = 0; it < iters; it++) {
        const int st = it & 1;
        const int hq = kh * G + it / nmt, m0 = (first + it % nmt) * BM;
        if (it + 1 < iters) {
            load_stage(it + 1, st ^ 1);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        int seen = 0;   // ORDER 3: the counter, read early
        const act_t* cQ = sQ + st * BM * SD;
        const act_t* cdO = sdO + st * BM * SD;
        const float* cL = sL + st * BM;
        const float* cDl = sDl + st * BM;

        // S^T = K_w Q^T and dP^T = V_w dO^T  (16 keys x BM queries per m-tile)
        float sp[MT][BM / 8][4], dp[MT][BM / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < BM / 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) sp[mt][i][e] = dp[mt][i][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            u32 ka[MT][4], va[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const int ro = (wkey + mt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * SD + kk * 16 + (lane / 16) * 8;
                ldsm_x4(ka[mt], sK + ro);
                ldsm_x4(va[mt], sV + ro);
            }
#pragma unroll
            for (int nn = 0; nn < BM / 16; nn++) {
                u32 qb[4], ob[4];
                const int ro = (nn * 16 + (lane % 8) + (lane / 16) * 8) * SD + kk * 16 + ((lane / 8) % 2) * 8;
                ldsm_x4(qb, cQ + ro);
                ldsm_x4(ob, cdO + ro);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816(sp[mt][2 * nn], ka[mt], qb[0], qb[1]);
                    mma16816(sp[mt][2 * nn + 1], ka[mt], qb[2], qb[3]);
                    mma16816(dp[mt][2 * nn], va[mt], ob[0], ob[1]);
                    mma16816(dp[mt][2 * nn + 1], va[mt], ob[2], ob[3]);
                }
            }
        }
        // P^T = exp(S^T * scale - lse), masked; dS^T = P^T (dP^T - delta). With dropout (the
        // forward's mask Z, drawn again): dV takes (P Z)^T, dS^T = P^T (Z dP^T - delta).
        const bool need_mask = (n0 + BN > S) || (n0 + BN - 1 > m0 + offset);
        const i64 drow = ((i64)b * H + hq) * T + m0;   // query m0's row: element off + (drow + qc) S + key
        const bool aligned = DROP && ((dr.off | (i64)S) & 3) == 0;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < BM / 8; nt++) {
                float z[4];
                if (DROP) drop_bwd_frag(z, dr.off + (drow + nt * 8) * S, S, n0 + wkey + mt * 16, lane, aligned, dr);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int qc = nt * 8 + 2 * t + (e & 1);
                    int key = n0 + wkey + mt * 16 + g + (e >> 1) * 8;
                    float p = exp2f(sp[mt][nt][e] * scale_log2 - cL[qc]);
                    if (need_mask && (key >= S || key > m0 + qc + offset)) p = 0.f;
                    if (DROP) {
                        sp[mt][nt][e] = p * z[e];
                        dp[mt][nt][e] = p * (z[e] * dp[mt][nt][e] - cDl[qc]);
                    } else {
                        sp[mt][nt][e] = p;
                        dp[mt][nt][e] = p * (dp[mt][nt][e] - cDl[qc]);
                    }
                }
            }
        if (ORDER == 3 && threadIdx.x == 0) {
            if (it > 0)   // the last tile's adds were issued before the last barrier: count them in
                red_release(dQsem + ((i64)b * H + kh * G + (it - 1) / nmt) * nct + first + (it - 1) % nmt, 1);
            seen = ld_relaxed(dQsem + ((i64)b * H + hq) * nct + m0 / BM);
        }
        // dV += P^T dO ; dK += dS^T Q  (A from registers, B = dO / Q transposed from smem)
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++) {
            u32 pa[MT][4], da[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                pa[mt][0] = pack2(sp[mt][2 * kk][0], sp[mt][2 * kk][1]);
                pa[mt][1] = pack2(sp[mt][2 * kk][2], sp[mt][2 * kk][3]);
                pa[mt][2] = pack2(sp[mt][2 * kk + 1][0], sp[mt][2 * kk + 1][1]);
                pa[mt][3] = pack2(sp[mt][2 * kk + 1][2], sp[mt][2 * kk + 1][3]);
                da[mt][0] = pack2(dp[mt][2 * kk][0], dp[mt][2 * kk][1]);
                da[mt][1] = pack2(dp[mt][2 * kk][2], dp[mt][2 * kk][3]);
                da[mt][2] = pack2(dp[mt][2 * kk + 1][0], dp[mt][2 * kk + 1][1]);
                da[mt][3] = pack2(dp[mt][2 * kk + 1][2], dp[mt][2 * kk + 1][3]);
                // store dS^T (fp16) for the dQ product
                act_t* w0 = sdS + (wkey + mt * 16 + g) * SP + kk * 16 + 2 * t;
                *reinterpret_cast<u32*>(w0) = da[mt][0];
                *reinterpret_cast<u32*>(w0 + 8 * SP) = da[mt][1];
                *reinterpret_cast<u32*>(w0 + 8) = da[mt][2];
                *reinterpret_cast<u32*>(w0 + 8 * SP + 8) = da[mt][3];
            }
#pragma unroll
            for (int dn = 0; dn < D / 16; dn++) {
                u32 ob[4], qb[4];
                const int ro = (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * SD + dn * 16 + (lane / 16) * 8;
                ldsm_x4_t(ob, cdO + ro);
                ldsm_x4_t(qb, cQ + ro);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816(dv[mt][2 * dn], pa[mt], ob[0], ob[1]);
                    mma16816(dv[mt][2 * dn + 1], pa[mt], ob[2], ob[3]);
                    mma16816(dk[mt][2 * dn], da[mt], qb[0], qb[1]);
                    mma16816(dk[mt][2 * dn + 1], da[mt], qb[2], qb[3]);
                }
            }
        }
        // this tile's counter: the key blocks nb + 1 .. the last that sees the tile add before this one
        // (PAIR tiles share a counter: the last key block that sees any of them counts)
        const int ti = m0 / BM, lt = min(ti / PAIR * PAIR + PAIR - 1, nqt - 1);
        int* sem = dQsem + ((i64)b * H + hq) * nct + ti / PAIR;
        const int want = min(nkb - 1, ((lt + 1) * BM + offset - 1) / BN) - nb;
        if (ORDER == 1 && threadIdx.x == 0 && (ti % PAIR == 0 || it % nmt == 0)) {   // a segment's first tile
            while (ld_acquire(sem) != want) __nanosleep(32);
        } else if (ORDER == 3 && threadIdx.x == 0) {
            while (seen != want) { __nanosleep(32); seen = ld_relaxed(sem); }
        }
        __syncthreads();
        // dQ (BM x D) += dS (BM x BN) K (BN x D); warp -> 16 rows x DC columns
        {
            const int rg = warp % RG, cg = warp / RG;
            float dq[DC / 8][4];
#pragma unroll
            for (int i = 0; i < DC / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                u32 a[4];
                ldsm_x4_t(a, sdS + (kk * 16 + (lane % 8) + (lane / 16) * 8) * SP + rg * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
                for (int dn = 0; dn < DC / 16; dn++) {
                    u32 kb[4];
                    ldsm_x4_t(kb, sK + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * SD + cg * DC + dn * 16 + (lane / 16) * 8);
                    mma16816(dq[2 * dn], a, kb[0], kb[1]);
                    mma16816(dq[2 * dn + 1], a, kb[2], kb[3]);
                }
            }
#pragma unroll
            for (int rh = 0; rh < 2; rh++) {
                int r = m0 + rg * 16 + g + rh * 8;
                if (r < T) {
                    float* dstp = dQacc + (((i64)b * H + hq) * T + r) * D + cg * DC + 2 * t;
#pragma unroll
                    for (int dn = 0; dn < DC / 8; dn++)
                        atomicAdd(reinterpret_cast<float2*>(dstp + dn * 8),
                                  make_float2(dq[dn][2 * rh] * scale, dq[dn][2 * rh + 1] * scale));
                }
            }
        }
        __syncthreads();
        if (ORDER == 1 && threadIdx.x == 0 && (m0 / BM % PAIR == PAIR - 1 || it % nmt == nmt - 1))
            // this block's adds (of the segment's tiles) are in
            red_release(dQsem + ((i64)b * H + hq) * nct + m0 / BM / PAIR, 1);
    }
    if (ORDER == 3 && threadIdx.x == 0)   // the last tile's adds (issued before the loop's last barrier)
        red_release(dQsem + ((i64)b * H + kh * G + (iters - 1) / nmt) * nct + first + (iters - 1) % nmt, 1);
    // write dK (scaled) and dV, layout (B, K, S, D) contiguous
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
        int key = n0 + wkey + mt * 16 + g + rh * 8;
        if (key < S) {
            i64 base = (((i64)b * KH + kh) * S + key) * D + 2 * t;
#pragma unroll
            for (int dn = 0; dn < D / 8; dn++) {
                *reinterpret_cast<act2_t*>(dK + base + dn * 8) =
                    from_f2(dk[mt][dn][2 * rh] * scale, dk[mt][dn][2 * rh + 1] * scale);
                *reinterpret_cast<act2_t*>(dV + base + dn * 8) =
                    from_f2(dv[mt][dn][2 * rh], dv[mt][dn][2 * rh + 1]);
            }
        }
    }
}

#define FWD_ARGS                                                                                  \
    const act_t *Q, const act_t *K, const act_t *V, act_t *O, float *LSE, int H, int KH, int T,  \
        int S, i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 kst, i64 vsb, i64 vsh, i64 vst,  \
        i64 osb, i64 osh, i64 ost, float scale_log2
#define FWD_PASS Q, K, V, O, LSE, H, KH, T, S, qsb, qsh, qst, ksb, ksh, kst, vsb, vsh, vst, osb, osh, ost, scale_log2

// The forward kernels, one per head dim (cuda_ops.FLASH_FWD holds their tiles, BM x BN): two
// 16-row m-tiles per warp, BM = 128; BN = 64 keys per tile, 32 at head dim 128 (whose Q fragments
// are re-read from shared memory instead of held in registers). Chosen by benchmarks/kernels/flash_attn.py.
extern "C" __global__ void __launch_bounds__(128) flash_fwd_d32(FWD_ARGS) { flash_fwd<32, 2, 64, 4, true>(FWD_PASS); }
extern "C" __global__ void __launch_bounds__(128) flash_fwd_d64(FWD_ARGS) { flash_fwd<64, 2, 64, 4, true>(FWD_PASS); }
extern "C" __global__ void __launch_bounds__(128) flash_fwd_d128(FWD_ARGS) { flash_fwd<128, 2, 32, 4, false>(FWD_PASS); }

// The same with attention dropout (the same tiles; cuda_ops launches these when drop= has p > 0).
#define DROP_ARGS i64 doff, u32 k0, u32 k1, u32 thr, float dscale
#define DROP_PASS Drop{doff, k0, k1, thr, dscale}
extern "C" __global__ void __launch_bounds__(128) flash_fwd_d32_drop(FWD_ARGS, DROP_ARGS) {
    flash_fwd<32, 2, 64, 4, true, true>(FWD_PASS, DROP_PASS);
}
extern "C" __global__ void __launch_bounds__(128) flash_fwd_d64_drop(FWD_ARGS, DROP_ARGS) {
    flash_fwd<64, 2, 64, 4, true, true>(FWD_PASS, DROP_PASS);
}
extern "C" __global__ void __launch_bounds__(128) flash_fwd_d128_drop(FWD_ARGS, DROP_ARGS) {
    flash_fwd<128, 2, 32, 4, false, true>(FWD_PASS, DROP_PASS);
}

#define BWD_ARGS                                                                                  \
    const act_t *Q, const act_t *K, const act_t *V, const act_t *dO, const float *LSE,           \
        const float *Delta, float *dQacc, int *dQsem, act_t *dK, act_t *dV, int H, int KH, int T, \
        int S,                                                                                    \
        i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 kst, i64 vsb, i64 vsh, i64 vst,          \
        i64 dsb, i64 dsh, i64 dst, float scale, float scale_log2, int heavy_first
#define BWD_PASS Q, K, V, dO, LSE, Delta, dQacc, dQsem, dK, dV, H, KH, T, S, qsb, qsh, qst, ksb, ksh, kst, \
                 vsb, vsh, vst, dsb, dsh, dst, scale, scale_log2, heavy_first

// The backward kernels, one per head dim (cuda_ops.FLASH_BWD holds their tiles, BM x BN): BM = 32
// query rows per tile; two 16-key m-tiles per warp (BN = 128) at head dims 32 and 64, one
// (BN = 64) at head dim 128, where two would need more than 255 registers. Chosen by
// benchmarks/kernels/flash_attn.py.
extern "C" __global__ void __launch_bounds__(128) flash_bwd_d32(BWD_ARGS) { flash_bwd<32, 32, 2, 4, 1, 0, 2>(BWD_PASS); }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_d64(BWD_ARGS) { flash_bwd<64, 32, 2, 4, 1, 0, 2>(BWD_PASS); }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_d128(BWD_ARGS) { flash_bwd<128, 32, 1, 4, 1, 0, 2>(BWD_PASS); }

extern "C" __global__ void __launch_bounds__(128) flash_bwd_d32_drop(BWD_ARGS, DROP_ARGS) {
    flash_bwd<32, 32, 2, 4, 1, 0, 2, true>(BWD_PASS, DROP_PASS);
}
extern "C" __global__ void __launch_bounds__(128) flash_bwd_d64_drop(BWD_ARGS, DROP_ARGS) {
    flash_bwd<64, 32, 2, 4, 1, 0, 2, true>(BWD_PASS, DROP_PASS);
}
extern "C" __global__ void __launch_bounds__(128) flash_bwd_d128_drop(BWD_ARGS, DROP_ARGS) {
    flash_bwd<128, 32, 1, 4, 1, 0, 2, true>(BWD_PASS, DROP_PASS);
}

#endif  // HAS_MMA
