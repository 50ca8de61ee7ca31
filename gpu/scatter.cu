// Row scatter-add in index order (bytemodel.ops.cuda_scatter.add_rows; NumPy twin
// ops/scatter_ops.add_rows, np.add.at).
//
// key (n,) int64 sorted ascending: row * n + i for the i-th value of row `row` (row == R: masked
// out, sorted last); vals (n, m) T; out (R, m) T. One thread per (position k, column c); the
// thread at the first position of a row's run adds that run's values, in i's order, to out's
// value and writes it once: the same sequence of additions as np.add.at, so the same bits, with
// no atomics and no two threads writing one element.
typedef long long i64;

// The value type, one module per type (ops/cuda_scatter.py passes -DVAL_KIND=k).
#if VAL_KIND == 0
typedef double T;
#elif VAL_KIND == 1
typedef float T;
#elif VAL_KIND == 2
typedef long long T;
#elif VAL_KIND == 3
typedef int T;
#else
typedef unsigned short T;
#endif

extern "C" __global__ void add_rows(const i64* __restrict__ key, const T* __restrict__ vals, T* __restrict__ out,
                                    i64 n, i64 m, i64 R) {
    const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (tid >= n * m) return;
    const i64 k = tid / m, c = tid % m;
    const i64 row = key[k] / n;
    if (row >= R || (k > 0 && key[k - 1] / n == row)) return;
    T acc = out[row * m + c];
    for (i64 j = k; j < n && key[j] / n == row; ++j) acc = (T)(acc + vals[(key[j] % n) * m + c]);
    out[row * m + c] = acc;
}
