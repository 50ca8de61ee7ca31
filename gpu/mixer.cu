// The device mixer's integer scatters and context keys (bytemodel.ops.cuda_scatter: add_ones,
// put_last, claim_rows, context_keys; NumPy twins ops/scatter_ops.py and compress/mix2.ContextMix2._keys).
//
// Every result here is an integer, so atomics give the reference's bits: a sum of ones does not
// depend on its order, and "the last (first) writer" is the largest (smallest) index i, chosen by
// atomicMax (atomicMin) on a scratch slot per row before anyone writes. The scratch arrays hold
// their resting value (-1 for max, INT_MAX for min) between calls: each call puts back what it took.
typedef long long i64;
typedef unsigned long long u64;

#define KEEP(i) (has_mask == 0 || mask[i])

// out[idx[i]] += 1 where mask[i]: uint16 wrapping as NumPy does (a compare-and-swap on the aligned
// 32-bit word that holds it, changing only its half).
extern "C" __global__ void add_ones_u16(unsigned short* out, const i64* __restrict__ idx, const bool* __restrict__ mask,
                                        int has_mask, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !KEEP(i)) return;
    unsigned short* p = out + idx[i];
    unsigned int* w = (unsigned int*)((unsigned long long)p & ~3ull);
    const unsigned int shift = ((unsigned long long)p & 2ull) ? 16u : 0u;
    unsigned int old = *w, seen;
    do {
        seen = old;
        const unsigned int half = ((seen >> shift) + 1u) & 0xffffu;
        old = atomicCAS(w, seen, (seen & ~(0xffffu << shift)) | (half << shift));
    } while (old != seen);
}

// out[idx[i]] += 1 where mask[i], int64 (two's complement: an unsigned add gives its bits).
extern "C" __global__ void add_ones_i64(i64* out, const i64* __restrict__ idx, const bool* __restrict__ mask,
                                        int has_mask, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !KEEP(i)) return;
    atomicAdd((u64*)(out + idx[i]), 1ull);
}

// scratch[idx[i]] = max (largest = 1) or min (0) of the i that take part (mask).
extern "C" __global__ void claim(const i64* __restrict__ idx, const bool* __restrict__ mask, int has_mask, int* scratch,
                                 int largest, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !KEEP(i)) return;
    if (largest) atomicMax(scratch + idx[i], (int)i);
    else atomicMin(scratch + idx[i], (int)i);
}

// The winner of each row writes: out[idx[i]] = vals[i] where scratch[idx[i]] == i (one i per row).
extern "C" __global__ void put_won_i64(i64* out, const i64* __restrict__ idx, const i64* __restrict__ vals,
                                       const int* __restrict__ scratch, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || scratch[idx[i]] != (int)i) return;
    out[idx[i]] = vals[i];
}

extern "C" __global__ void put_won_u16(unsigned short* out, const i64* __restrict__ idx,
                                       const unsigned short* __restrict__ vals, const int* __restrict__ scratch, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || scratch[idx[i]] != (int)i) return;
    out[idx[i]] = vals[i];
}

// scratch[idx[i]] = rest where mask[i] (after put_won: the slots back at their resting value).
extern "C" __global__ void release(const i64* __restrict__ idx, const bool* __restrict__ mask, int has_mask,
                                   int* scratch, int rest, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !KEEP(i)) return;
    scratch[idx[i]] = rest;
}

// Rows idx[i] where mask[i] zeroed: out (R, m) uint16 and total (R,) int64 (blocks of threads over i's columns).
extern "C" __global__ void zero_rows(unsigned short* out, i64* total, const i64* __restrict__ idx,
                                     const bool* __restrict__ mask, i64 n, i64 m) {
    const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (tid >= n * m) return;
    const i64 i = tid / m, c = tid % m;
    if (!mask[i]) return;
    out[idx[i] * m + c] = 0;
    if (c == 0) total[idx[i]] = 0;
}

// ContextMix2._keys before step t for the first `active` streams: back (active, depth + 1) int64, column
// k the token k back (hist[s, t + 1 - k] for 1 <= k <= min(t, depth), else A; column 0 is A); keys
// (active, nm) uint64, context c's hash: h = salt[c]; for each distance j of c (dist[off[c]..off[c + 1]]):
// h = h * P + back[s, j] + j; then h ^= h >> 29, h *= P, h ^= h >> 32. All modulo 2^64, as NumPy's uint64.
extern "C" __global__ void context_keys(const int* __restrict__ hist, i64 row_len, i64 t, i64 active, int depth,
                                        i64 A, const i64* __restrict__ dist, const i64* __restrict__ off,
                                        const u64* __restrict__ salts, int nm, u64 P, i64* back, u64* keys) {
    const i64 s = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= active) return;
    const int* h_s = hist + s * row_len;
    for (int k = 0; k <= depth; ++k)
        back[s * (depth + 1) + k] = (k >= 1 && k <= t) ? (i64)h_s[t + 1 - k] : A;
    for (int c = 0; c < nm; ++c) {
        u64 h = salts[c];
        for (i64 q = off[c]; q < off[c + 1]; ++q) {
            const i64 j = dist[q];
            const i64 v = (j <= t) ? (i64)h_s[t + 1 - j] : A;
            h = h * P + (u64)v + (u64)j;
        }
        h ^= h >> 29;
        h *= P;
        h ^= h >> 32;
        keys[s * nm + c] = h;
    }
}
