// The "ctx3f" mixer's step on the device: ctx3's arithmetic (compress/mix2.ContextMix3) as eight
// kernels a step instead of ~100 CuPy calls (bytemodel.ops.cuda_mix; the Python side and its NumPy
// reference, ctx3d on NumPy: compress/mix3f.py).
//
//   mix_prepare  block per stream: rows, checks, counts, order, weight rows, the inputs X[1:]   (= prepare)
//   mix_predict  block per stream: X[0] = the network, the two sets' logits, the mix, softmax,
//                the coder's frequencies                                                   (= predict + quantise)
//   mix_grad     block per stream: the weight gradients of the coded token                 (update, floats)
//   mix_apply    warp per weight row: the step's contributions summed, added once          (update, weights)
//   mix_claim, mix_own, mix_count, mix_halve: checked rows changing hands, the counts, LIMIT's halving
//   mix_advance, mix_put: order 0, history, words, the match model                         (ContextMix._advance)
//
// Shapes (S' = active streams, A the alphabet, K = MIX_K contexts, M = K + 2 inputs, SETS = 2):
//   X (S', M, A) f64, W (S', SETS, M) f64, zs (S', SETS, A), z, p (S', A) f64, freqs (S', A) f32,
//   rows (S', K) i64, chk (S', K) u16, bad (S', K) u8, sel (S', SETS) i64, order (S',), cls (S', K) i64,
//   pred, lb (S',) i64, has (S',) u8; g (S', SETS, M), gv (S', SETS), gm (S',), gc (S', K) f64.
//
// Determinism: every float sum over the alphabet is a fixed tree (each thread's strided partial,
// warp shuffles, then the warps in order) and every weight row's step a fixed tree over its
// contributions in stream order, so a step is the same bits on every run of the same device; they
// are not NumPy's orders, so the floats differ from ctx3d's in the last bits (hence a new name).
// Integer work picks one thread per row by atomicMax on an int64 slot that holds (epoch << 32 | rank);
// each use has a fresh epoch from the host, so no slot is ever reset.
typedef long long i64;
typedef unsigned long long u64;
typedef unsigned short u16;
typedef unsigned char u8;

#ifndef MIX_K
#error "MIX_K: the mixer's context count"
#endif
#define MIX_M (MIX_K + 2)
#define SETS 2
#define THREADS 256
#define WARPS (THREADS / 32)
#define NEG_INF (-__longlong_as_double(0x7ff0000000000000ll))

__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;                                            // lane 0's is the sum
}

struct Sum { template <typename T> __device__ T operator()(T a, T b) const { return a + b; } };
struct Max { __device__ double operator()(double a, double b) const { return fmax(a, b); } };

// op over the block of each thread's v, the same value to every thread (sh: WARPS slots): a shuffle
// tree in each warp, then the warps in order, so a float sum is the same bits every run.
template <typename T, typename Op>
__device__ T block_reduce(T v, T* sh, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    T t = sh[0];
    for (int w = 1; w < WARPS; ++w) t = op(t, sh[w]);
    return t;
}

__device__ double block_sum(double v, double* sh) { return block_reduce(v, sh, Sum()); }
__device__ double block_max(double v, double* sh) { return block_reduce(v, sh, Max()); }
__device__ i64 block_sum_i64(i64 v, i64* sh) { return block_reduce(v, sh, Sum()); }

// floor(log2(x)) of an integer-valued double x >= 1 (ctx3d's frexp), exactly.
__device__ __forceinline__ int floor_log2(double x) { return 63 - __clzll((i64)x); }

// Step t's inputs but the network's, for stream s = blockIdx.x (ContextMix2.prepare). kind[k]: 0 a
// one-token context (row = back[s, arg]), 1 a hashed token context (keys[s, arg]), 2 the word, 3 the word
// with the word before (arg: the context's index i, as ContextMix._word_key takes it).
extern "C" __global__ void __launch_bounds__(THREADS) mix_prepare(
        const i64* __restrict__ back, int depth1, const u64* __restrict__ keys, int nm,
        const int* __restrict__ kind, const int* __restrict__ arg, const i64* __restrict__ offset, i64 R, u64 P,
        const u64* __restrict__ word, const u64* __restrict__ prev_word,
        const u16* __restrict__ check, const u16* __restrict__ table, const i64* __restrict__ total,
        const i64* __restrict__ c0, const double* __restrict__ log_c, double alpha_a,
        const double* __restrict__ Ws, const i64* __restrict__ base, const double* __restrict__ Wc,
        int chain, int n_buckets, int conf_buckets,
        const i64* __restrict__ mptr, const i64* __restrict__ mlen, const int* __restrict__ hist, int max_len,
        i64 A, double* X, double* W, i64* rows, u16* chk, u8* bad, i64* sel, i64* order, i64* cls,
        i64* pred, u8* has, i64* lb) {
    const i64 s = blockIdx.x;
    const int tid = threadIdx.x;
    __shared__ i64 s_row[MIX_K], s_sel[SETS], s_cls[MIX_K], s_i64[WARPS];
    __shared__ double s_cnt[MIX_K], s_lden[MIX_K];
    __shared__ unsigned int s_max[MIX_K];
    __shared__ int s_bad[MIX_K];
    if (tid < MIX_K) {
        const int k = tid;
        i64 row;
        u16 ch = 0;
        if (kind[k] == 0) {
            row = back[s * depth1 + arg[k]];
        } else {
            u64 h;
            if (kind[k] == 1) {
                h = keys[s * nm + arg[k]];
            } else {
                h = word[s] * P + (u64)arg[k];
                if (kind[k] == 3) h = (h ^ (prev_word[s] >> 7)) * P;
                h ^= h >> 32;
            }
            row = (i64)(h % (u64)R);
            ch = (u16)((h >> 48) | 1ull);
        }
        row += offset[k];
        const int b = check[row] != ch;
        rows[s * MIX_K + k] = row;
        chk[s * MIX_K + k] = ch;
        bad[s * MIX_K + k] = (u8)b;
        s_row[k] = row;
        s_bad[k] = b;
        s_cnt[k] = b ? 0.0 : (double)total[row];
        s_lden[k] = log(s_cnt[k] + alpha_a);
        s_max[k] = 0;
    }
    i64 part = 0;
    for (i64 a = tid; a < A; a += THREADS) part += c0[a];
    const double den1 = (double)block_sum_i64(part, s_i64) + 0.5 * (double)A;   // (synchronises the above)
    double* Xs = X + s * MIX_M * A;
    for (i64 a = tid; a < A; a += THREADS) {
        Xs[A + a] = log(((double)c0[a] + 0.5) / den1);
        for (int k = 0; k < MIX_K; ++k) {
            const unsigned int u = s_bad[k] ? 0u : (unsigned int)table[s_row[k] * A + a];
            Xs[(2 + k) * A + a] = log_c[u] - s_lden[k];
            atomicMax(&s_max[k], u);
        }
    }
    __syncthreads();
    if (tid == 0) {
        int ord = 0;
        for (int k = 0; k < chain; ++k)
            if (s_cnt[k] > 0) ord = k + 1;
        const double n_top = ord > 0 ? s_cnt[ord - 1] : 0.0;
        const int bucket = min(floor_log2(n_top + 1.0) / 2, n_buckets - 1);
        s_sel[0] = (i64)ord * n_buckets + bucket + base[0];
        s_sel[1] = back[s * depth1 + 1] + base[1];
        order[s] = ord;
        sel[s * SETS] = s_sel[0];
        sel[s * SETS + 1] = s_sel[1];
        const i64 ptr = mptr[s];
        has[s] = (u8)(ptr >= 0);
        pred[s] = ptr >= 0 ? (i64)hist[ptr] : -1;
        lb[s] = min(mlen[s], (i64)max_len);
    }
    if (tid < MIX_K) {
        const int k = tid;
        const int nb = min(floor_log2(s_cnt[k] + 1.0), conf_buckets - 1);
        const i64 c = 2 * nb + (((double)s_max[k] == s_cnt[k]) && s_cnt[k] > 0);
        s_cls[k] = c;
        cls[s * MIX_K + k] = c;
    }
    __syncthreads();
    if (tid < SETS * MIX_M) {
        const int j = tid / MIX_M, m = tid % MIX_M;
        double w = Ws[s_sel[j] * MIX_M + m];
        if (m >= 2) w += Wc[(i64)(m - 2) * 2 * conf_buckets + s_cls[m - 2]];
        W[s * SETS * MIX_M + tid] = w;
    }
}

// X[0] = net, each set's logits zs_j = W_j . X, the mix z = V[order] . zs (+ the match bonus), its
// softmax p and the coder's frequencies (compress/coder.quantise: floor(p (total - A)) + 1, the
// remainder to the first likeliest) for stream s = blockIdx.x.
extern "C" __global__ void __launch_bounds__(THREADS) mix_predict(
        const double* __restrict__ net, double* X, const double* __restrict__ W, const double* __restrict__ V,
        const i64* __restrict__ order, const i64* __restrict__ pred, const u8* __restrict__ has,
        const i64* __restrict__ lb, const double* __restrict__ wm, i64 A, i64 total_f,
        double* zs, double* z, double* p, float* freqs) {
    const i64 s = blockIdx.x;
    const int tid = threadIdx.x;
    __shared__ double s_W[SETS * MIX_M], s_d[WARPS];
    __shared__ i64 s_i[WARPS];
    __shared__ i64 s_fv[WARPS], s_fa[WARPS];
    if (tid < SETS * MIX_M) s_W[tid] = W[s * SETS * MIX_M + tid];
    __syncthreads();
    const double v0 = V[order[s] * SETS], v1 = V[order[s] * SETS + 1];
    const i64 pr = has[s] ? pred[s] : -1;
    const double bonus = has[s] ? wm[lb[s]] : 0.0;
    double* Xs = X + s * MIX_M * A;
    double mx = NEG_INF;
    for (i64 a = tid; a < A; a += THREADS) {
        const double x0 = net[s * A + a];
        Xs[a] = x0;
        double z0 = s_W[0] * x0, z1 = s_W[MIX_M] * x0;
        for (int m = 1; m < MIX_M; ++m) {
            const double x = Xs[m * A + a];
            z0 += s_W[m] * x;
            z1 += s_W[MIX_M + m] * x;
        }
        zs[(s * SETS) * A + a] = z0;
        zs[(s * SETS + 1) * A + a] = z1;
        double zz = v0 * z0 + v1 * z1;
        if (a == pr) zz += bonus;
        z[s * A + a] = zz;
        mx = fmax(mx, zz);
    }
    mx = block_max(mx, s_d);
    double e = 0.0;
    for (i64 a = tid; a < A; a += THREADS) e += exp(z[s * A + a] - mx);
    const double sum = block_sum(e, s_d);
    i64 fs = 0, best = -1, at = 0;
    for (i64 a = tid; a < A; a += THREADS) {
        const double q = exp(z[s * A + a] - mx) / sum;
        p[s * A + a] = q;
        const i64 f = (i64)floor(q * (double)(total_f - A)) + 1;
        freqs[s * A + a] = (float)f;
        fs += f;
        if (f > best) { best = f; at = a; }            // a thread's first likeliest (its a ascend)
    }
    fs = block_sum_i64(fs, s_i);
    for (int o = 16; o > 0; o >>= 1) {                  // the block's first likeliest: largest f, then smallest a
        const i64 bf = __shfl_down_sync(0xffffffffu, best, o), ba = __shfl_down_sync(0xffffffffu, at, o);
        if (bf > best || (bf == best && ba < at)) { best = bf; at = ba; }
    }
    if ((tid & 31) == 0) { s_fv[tid >> 5] = best; s_fa[tid >> 5] = at; }
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < WARPS; ++w)
            if (s_fv[w] > best || (s_fv[w] == best && s_fa[w] < at)) { best = s_fv[w]; at = s_fa[w]; }
        freqs[s * A + at] = (float)(best + total_f - fs);
    }
}

// The gradients of log p[y] for stream s = blockIdx.x (ContextMix2.update's g, gv, gm and gc).
extern "C" __global__ void __launch_bounds__(THREADS) mix_grad(
        const double* __restrict__ X, const double* __restrict__ zs, const double* __restrict__ p,
        const i64* __restrict__ sym, const i64* __restrict__ pred, const u8* __restrict__ has, i64 A,
        double* g, double* gv, double* gm, double* gc) {
    const i64 s = blockIdx.x;
    const int tid = threadIdx.x;
    __shared__ double s_d[WARPS];
    __shared__ double s_part[WARPS][SETS * MIX_M + SETS];
    __shared__ double s_red[SETS * MIX_M + SETS];
    const double* Xs = X + s * MIX_M * A;
    const double* z0 = zs + (s * SETS) * A;
    const double* z1 = z0 + A;
    double m0 = NEG_INF, m1 = NEG_INF;
    for (i64 a = tid; a < A; a += THREADS) { m0 = fmax(m0, z0[a]); m1 = fmax(m1, z1[a]); }
    m0 = block_max(m0, s_d);
    m1 = block_max(m1, s_d);
    double e0 = 0.0, e1 = 0.0;
    for (i64 a = tid; a < A; a += THREADS) { e0 += exp(z0[a] - m0); e1 += exp(z1[a] - m1); }
    e0 = block_sum(e0, s_d);
    e1 = block_sum(e1, s_d);
    double acc[SETS * MIX_M + SETS];
#pragma unroll
    for (int i = 0; i < SETS * MIX_M + SETS; ++i) acc[i] = 0.0;
    for (i64 a = tid; a < A; a += THREADS) {
        const double q0 = exp(z0[a] - m0) / e0, q1 = exp(z1[a] - m1) / e1, pa = p[s * A + a];
#pragma unroll
        for (int m = 0; m < MIX_M; ++m) {
            const double x = Xs[m * A + a];
            acc[m] += q0 * x;
            acc[MIX_M + m] += q1 * x;
        }
        acc[SETS * MIX_M] += pa * z0[a];
        acc[SETS * MIX_M + 1] += pa * z1[a];
    }
#pragma unroll
    for (int i = 0; i < SETS * MIX_M + SETS; ++i) {
        const double v = warp_sum(acc[i]);
        if ((tid & 31) == 0) s_part[tid >> 5][i] = v;
    }
    __syncthreads();
    if (tid < SETS * MIX_M + SETS) {
        double t = 0.0;
        for (int w = 0; w < WARPS; ++w) t += s_part[w][tid];
        s_red[tid] = t;
    }
    __syncthreads();
    const i64 y = sym[s];
    if (tid < SETS * MIX_M) {
        const int j = tid / MIX_M, m = tid % MIX_M;
        s_part[0][tid] = Xs[m * A + y] - s_red[tid];       // (s_part's first row is free again)
        g[s * SETS * MIX_M + tid] = s_part[0][tid];
        (void)j;
    }
    if (tid < SETS) gv[s * SETS + tid] = zs[(s * SETS + tid) * A + y] - s_red[SETS * MIX_M + tid];
    if (tid == 0) gm[s] = (pred[s] == y ? 1.0 : 0.0) - (has[s] ? p[s * A + pred[s]] : 0.0);
    __syncthreads();
    if (tid < MIX_K) gc[s * MIX_K + tid] = (s_part[0][2 + tid] + s_part[0][MIX_M + 2 + tid]) / SETS;
}

// One warp adds to dest[0..ncol) the sum over items i (key[i * ks] == want, mask[i] if given) of
// rate * vals[i * vs + c]: lane-strided partials in item order, then a fixed shuffle tree.
__device__ void warp_row(const i64* __restrict__ key, i64 ks, const u8* __restrict__ mask, i64 want, i64 n,
                         const double* __restrict__ vals, i64 vs, int ncol, double rate, double* dest, int lane) {
    double acc[MIX_M];
#pragma unroll
    for (int c = 0; c < MIX_M; ++c) acc[c] = 0.0;
    for (i64 i = lane; i < n; i += 32) {
        if (key[i * ks] != want || (mask != nullptr && !mask[i])) continue;
#pragma unroll
        for (int c = 0; c < MIX_M; ++c)
            if (c < ncol) acc[c] += rate * vals[i * vs + c];
    }
#pragma unroll
    for (int c = 0; c < MIX_M; ++c) {
        if (c < ncol) {
            const double v = warp_sum(acc[c]);
            if (lane == 0) dest[c] += v;
        }
    }
}

// Every weight row's step: warps [0, nV) the final layer V (by order), [.., + nWs) the weight sets Ws
// (by sel), [.., + K * 2 conf) the confidence weights Wc (by cls), then the match bonus wm (by lb, has).
extern "C" __global__ void mix_apply(
        i64 active, const i64* __restrict__ order, const i64* __restrict__ sel, const i64* __restrict__ cls,
        const i64* __restrict__ lb, const u8* __restrict__ has,
        const double* __restrict__ g, const double* __restrict__ gv, const double* __restrict__ gm,
        const double* __restrict__ gc, double* V, i64 nV, double* Ws, i64 nWs, double* Wc, int conf2, double* wm,
        i64 nwm, double rate_v, double rate_w, double rate_c, double rate_m) {
    const i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    i64 r = w;
    if (r < nV) { warp_row(order, 1, nullptr, r, active, gv, SETS, SETS, rate_v, V + r * SETS, lane); return; }
    r -= nV;
    if (r < nWs) { warp_row(sel, 1, nullptr, r, SETS * active, g, MIX_M, MIX_M, rate_w, Ws + r * MIX_M, lane); return; }
    r -= nWs;
    if (r < (i64)MIX_K * conf2) {
        const i64 k = r / conf2, c = r % conf2;
        warp_row(cls + k, MIX_K, nullptr, c, active, gc + k, MIX_K, 1, rate_c, Wc + r, lane);
        return;
    }
    r -= (i64)MIX_K * conf2;
    if (r < nwm) warp_row(lb, 1, has, r, active, gm, 1, 1, rate_m, wm + r, lane);
}

// Rows read as another context's (bad) are cleared, and each such row's first claimant (smallest i)
// marked in scr: (epoch << 32) | (INT_MAX - i) is largest for it (mix_own then gives it the row).
extern "C" __global__ void mix_claim(const i64* __restrict__ rows, const u8* __restrict__ bad, i64 n, u16* table,
                                     i64* total, u64* scr, u64 epoch, i64 A) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !bad[i]) return;
    const i64 r = rows[i];
    for (i64 a = 0; a < A; ++a) table[r * A + a] = 0;
    total[r] = 0;
    atomicMax(scr + r, (epoch << 32) | (u64)(0x7fffffffll - i));
}

extern "C" __global__ void mix_own(const i64* __restrict__ rows, const u16* __restrict__ chk, const u8* __restrict__ bad,
                                   i64 n, u16* check, const u64* __restrict__ scr, u64 epoch) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !bad[i]) return;
    if (scr[rows[i]] == ((epoch << 32) | (u64)(0x7fffffffll - i))) check[rows[i]] = chk[i];
}

// The counts: table[row, sym] and total[row] + 1 for every entry whose row it owns (check == chk).
extern "C" __global__ void mix_count(const i64* __restrict__ rows, const u16* __restrict__ chk,
                                     const i64* __restrict__ sym, i64 n, const u16* __restrict__ check, u16* table,
                                     i64* total, i64 A) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const i64 r = rows[i];
    if (check[r] != chk[i]) return;
    u16* cell = table + r * A + sym[i / MIX_K];
    unsigned int* word = (unsigned int*)((u64)cell & ~3ull);
    const unsigned int shift = ((u64)cell & 2ull) ? 16u : 0u;
    unsigned int old = *word, seen;
    do {                                                  // uint16 + 1, wrapping, on its half of the word
        seen = old;
        const unsigned int half = ((seen >> shift) + 1u) & 0xffffu;
        old = atomicCAS(word, seen, (seen & ~(0xffffu << shift)) | (half << shift));
    } while (old != seen);
    atomicAdd((u64*)(total + r), 1ull);
}

// A row of its owner's whose total passed limit is halved, once (the first entry to mark it this epoch).
extern "C" __global__ void mix_halve(const i64* __restrict__ rows, const u16* __restrict__ chk, i64 n,
                                     const u16* __restrict__ check, u16* table, i64* total, u64* scr, u64 epoch,
                                     i64 limit, i64 A) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const i64 r = rows[i];
    if (check[r] != chk[i] || *(volatile i64*)(total + r) <= limit) return;
    if (atomicMax(scr + r, epoch << 32) >= (epoch << 32)) return;
    i64 sum = 0;
    for (i64 a = 0; a < A; ++a) {
        const u16 v = table[r * A + a] >> 1;
        table[r * A + a] = v;
        sum += v;
    }
    total[r] = sum;
}

// ContextMix._advance for stream s: order 0, the history, the words, the match model's pointer and
// its table slot (the stream that writes a slot is the largest s, marked in mscr; mix_put writes it).
extern "C" __global__ void mix_advance(const i64* __restrict__ sym, i64 active, i64 t, i64 row_len, int* hist,
                                       i64* c0, const u8* __restrict__ wordish, u64* word, u64* prev_word,
                                       const i64* __restrict__ pred, const u8* __restrict__ has, i64* mlen, i64* mptr,
                                       const i64* __restrict__ mtab, i64* slot, u64* mscr, u64 epoch, u64 P,
                                       int match_min, u64 match_mask) {
    const i64 s = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= active) return;
    const i64 y = sym[s];
    atomicAdd((u64*)(c0 + y), 1ull);
    int* h_s = hist + s * row_len;
    h_s[t + 1] = (int)y;
    const u64 wd = word[s];
    const bool w = wordish[y] != 0;
    if (!w && wd != 0) prev_word[s] = wd;
    word[s] = w ? (wd + 1ull) * P + (u64)y : 0ull;
    const bool ok = has[s] && pred[s] == y;
    mlen[s] = ok ? mlen[s] + 1 : 0;
    i64 ptr = ok ? mptr[s] + 1 : -1;
    if (t + 1 >= match_min) {
        u64 h = 0;
        for (int j = 0; j < match_min; ++j) h = h * P + (u64)(i64)h_s[t + 1 - j];
        h ^= h >> 31;
        const i64 sl = (i64)(h & match_mask);
        const i64 found = mtab[sl];
        if (ptr < 0 && found >= 0) ptr = found;
        slot[s] = sl;
        atomicMax(mscr + sl, (epoch << 32) | (u64)s);
    }
    mptr[s] = ptr;
}

extern "C" __global__ void mix_put(const i64* __restrict__ slot, i64 active, i64 t, i64 row_len, i64* mtab,
                                   const u64* __restrict__ mscr, u64 epoch) {
    const i64 s = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= active) return;
    if (mscr[slot[s]] == ((epoch << 32) | (u64)s)) mtab[slot[s]] = s * row_len + t + 2;
}
