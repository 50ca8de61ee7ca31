// The wgmma forward's other tiles (gpu/flash_hopper.cu's flash_fwd_h template), kept for study and
// timed by benchmarks/kernels/flash_attn.py (appended to that file's source when compiled; their
// tiles are cuda_ops.HOPPER_FWD_KERNELS). name, D, BN, warpgroups, stages, overlap (the scores of
// the next tile in flight during this tile's softmax), swizzle (0: core matrices, 1: 128-byte),
// ping-pong (the two warpgroups take turns at the score product), CTAs per SM asked of the register
// allocator. On the H200 (benchmarks/README.md) the swizzled two-warpgroup tiles without overlap
// won; the overlap variants lost at every shape. Ping-pong (_p) won at D = 128 (h128_bsp, shipped since)
// and lost at D = 64 with BN = 64 and two CTAs a SM (h64_bsp); h64_asp / h64_bsp1 try it with BN = 128
// and with one CTA a SM (not run yet).
#if HAS_MMA
FWD_H(flash_fwd_h64_a, 64, 128, 2, 2, false, 0, false, 1)
FWD_H(flash_fwd_h64_b, 64, 64, 2, 2, false, 0, false, 2)
FWD_H(flash_fwd_h64_as, 64, 128, 2, 2, false, 1, false, 1)
FWD_H(flash_fwd_h64_cs, 64, 64, 1, 2, false, 1, false, 3)
FWD_H(flash_fwd_h64_ds, 64, 64, 1, 3, true, 1, false, 3)
FWD_H(flash_fwd_h64_es, 64, 128, 1, 3, true, 1, false, 2)
FWD_H(flash_fwd_h64_fs, 64, 64, 2, 3, true, 1, false, 1)
FWD_H(flash_fwd_h64_gs, 64, 128, 2, 3, true, 1, false, 1)
FWD_H(flash_fwd_h128_b, 128, 128, 2, 2, false, 0, false, 1)
FWD_H(flash_fwd_h128_as, 128, 64, 2, 2, false, 1, false, 1)
FWD_H(flash_fwd_h128_cs, 128, 64, 1, 2, false, 1, false, 2)
FWD_H(flash_fwd_h128_ds, 128, 64, 1, 3, true, 1, false, 2)
FWD_H(flash_fwd_h128_es, 128, 64, 2, 3, true, 1, false, 1)
FWD_H(flash_fwd_h64_bsp, 64, 64, 2, 2, false, 1, true, 2)
FWD_H(flash_fwd_h64_asp, 64, 128, 2, 2, false, 1, true, 1)
FWD_H(flash_fwd_h64_bsp1, 64, 64, 2, 2, false, 1, true, 1)
FWD_H(flash_fwd_h128_bs, 128, 128, 2, 2, false, 1, false, 1)       // shipped until the ping-pong tile beat it
FWD_H(flash_fwd_h128_asp, 128, 64, 2, 2, false, 1, true, 1)
// The backward's study variants (MODE bits of flash_bwd_h; benchmarks/kernels/flash_attn.py's
// HOPPER_BWD_VARIANTS): m8 / m24 defer a tile's dQ adds behind the next tile's score products (the
// sums in the dQ registers / in the exchange buffer; m8's owner-only writes to the dQ accumulators
// make ptxas serialize every wgmma of the kernel, C7518, which m24 avoids at D = 64 too; m24 shipped
// at D = 64 until h_v4 and stays as h_staged), m0 the immediate adds (shipped at D = 64 until m24),
// m1 the immediate adds without the ordered wait, m2 leaves the dQ product and its adds out.
BWD_H(flash_bwd_h64_m8, 64, 64, 8)
BWD_H(flash_bwd_h64_m0, 64, 64, 0)
BWD_H(flash_bwd_h64_m1, 64, 64, 1)
BWD_H(flash_bwd_h64_m2, 64, 64, 2)
BWD_H(flash_bwd_h128_m24, 128, 64, 24)
BWD_H(flash_bwd_h128_m2, 128, 64, 2)
BWD_H(flash_bwd_h64_m24, 64, 64, 24)
// the dQ adds as red.global.add.v4.f32 after a lane swap (MODE bit 5: half the reductions): h_v4,
// shipped at D = 64 since the twenty-ninth session (MODE 56, the staged adds so made); at D = 128,
// where the swap spilled 28 bytes, -30% (H100, twenty-seventh session); since the partner's values
// are computed before their swaps (twenty-ninth session: the shipped kernels' cubin unchanged under
// NVRTC 12.9) it spills 4 bytes there and still loses 28-31% (H100, twenty-ninth session; the
// tests passed on it and its dropout twin); MODE 56 at 128 spills 32
BWD_H(flash_bwd_h128_m32, 128, 64, 32)
BWD_H_DROP(flash_bwd_h128_m32_drop, 128, 64, 32, 2)
// (h_bulk, MODE bit 6: the staged sums added by the bulk copy engine a row at a time: the shipped
// bytes but 22-26% slower at D = 64 on an H100; taken out of flash_bwd_h, benchmarks/README.md)
// a tile's dQ product left in flight past its iteration and finished (exchange, sums, ordered adds)
// behind the next tile's score products (MODE bit 7, PIPE; with bit 5 the adds as red.v4): h_pipe,
// h_pipe_v4: the shipped bytes and the GPU tests passed (h_pipe as if shipped, its dropout twin
// too), but 8-10% slower than the staged adds at D = 64 on the H100 (twenty-ninth session; 242
// registers against 226, two exchanges); at D = 128 (512 bytes of spill) 36-37% slower
BWD_H(flash_bwd_h64_m128, 64, 64, 128)
BWD_H(flash_bwd_h64_m160, 64, 64, 160)
BWD_H(flash_bwd_h128_m128, 128, 64, 128)
// h_pipe's twin with attention dropout (tests/conftest.py swaps the pair in; device_check.sh dq)
BWD_H_DROP(flash_bwd_h64_m128_drop, 64, 64, 128, 2)
// the dQ product split by columns (MODE bit 8, SPLIT): each warpgroup makes D / 2 columns of dQ over
// all 128 keys of the block (at D = 64 an m64n32k16 chain whose B starts 64 bytes into K's swizzle
// atom), so no exchange of partial sums and every thread adds its own columns (D / 4 accumulator
// registers against D / 2); its own summation order, so its own bytes (still repeatable: the
// ordered reduction is kept). h_split (m256, float2 adds), h_split_v4 (m288, red.v4). H100,
// thirtieth session: at D = 64 both lose to the shipped h_v4 (-1% to -6%; m296, the v4 adds
// deferred behind the next tile's score products in registers, -18%, since taken out; at D = 128
// that deferral spilled and serialized the wgmma, C7518); at D = 128 m256 won (+6-7% over the
// immediate adds) and ships as flash_bwd_h128, m288 there is level with the immediate adds. The
// flash, dropout and ordering tests passed on m296 + m256 and m288 + m288 (D = 64 + 128, with
// their dropout twins) as if shipped. h_immediate at 128 (m0) is the kernel shipped before.
BWD_H(flash_bwd_h64_m256, 64, 64, 256)
BWD_H(flash_bwd_h64_m288, 64, 64, 288)
BWD_H(flash_bwd_h128_m288, 128, 64, 288)
BWD_H(flash_bwd_h128_m0, 128, 64, 0)
// (h_solo, MODE bit 9: one warpgroup of 64 keys a CTA, 128 threads, two CTAs an SM, no exchange
// and no barrier shared with another warpgroup, twice the dQ adds: correct, the tests passed on it
// as if shipped, but 25-40% slower at D = 64 on an H100 (thirtieth session); taken out of
// flash_bwd_h, the figures are from the kernel as it was at da8bf1d)
// What the dropout hash costs (benchmarks/kernels/attn_dropout.py --hash-study): the shipped dropout
// kernels with the hash cut to one murmur3 finaliser (_r1) or to one multiply (_r0); their masks
// are not the reference's (timing only).
FWD_H_DROP(flash_fwd_h64_bs_drop_r1, 64, 64, 2, 2, false, 1, false, 2, 1)
FWD_H_DROP(flash_fwd_h64_bs_drop_r0, 64, 64, 2, 2, false, 1, false, 2, 0)
BWD_H_DROP(flash_bwd_h64_drop_r1, 64, 64, 56, 1)
BWD_H_DROP(flash_bwd_h64_drop_r0, 64, 64, 56, 0)
#endif
