// FlashAttention tile configurations kept for study and timing, not shipped (gpu/flash_attn.cu
// ships one forward and one backward kernel per head dim). This file is appended to
// gpu/flash_attn.cu's source by benchmarks/kernels/flash_attn.py, which validates each variant against the
// shipped kernel before timing it; benchmarks/README.md has the figures that chose the shipped ones.
//
// name: flash_{fwd|bwd}_{version}_d{head dim}; the tiles (BM x BN) are in flash_attn.py's VARIANTS_FWD and VARIANTS_BWD.
#if HAS_MMA
// forward v1: one 16-row m-tile per warp (BM = 64), BN = 64: the first version
extern "C" __global__ void __launch_bounds__(128) flash_fwd_v1_d32(FWD_ARGS) { flash_fwd<32, 1, 64, 4, true>(FWD_PASS); }
extern "C" __global__ void __launch_bounds__(128) flash_fwd_v1_d64(FWD_ARGS) { flash_fwd<64, 1, 64, 4, true>(FWD_PASS); }
extern "C" __global__ void __launch_bounds__(128) flash_fwd_v1_d128(FWD_ARGS) { flash_fwd<128, 1, 64, 4, true>(FWD_PASS); }
// forward v3: two m-tiles per warp (BM = 128) with narrower key tiles: fewer registers, 3 CTAs
// per SM at head dim 64
extern "C" __global__ void __launch_bounds__(128, 3) flash_fwd_v3_d64(FWD_ARGS) { flash_fwd<64, 2, 32, 4, true>(FWD_PASS); }
extern "C" __global__ void __launch_bounds__(128) flash_fwd_v3_d128(FWD_ARGS) { flash_fwd<128, 2, 16, 4, false>(FWD_PASS); }
// backward v1: one 16-key m-tile per warp (BN = 64), BM = 64 at head dims 32 and 64
extern "C" __global__ void __launch_bounds__(128) flash_bwd_v1_d32(BWD_ARGS) { flash_bwd<32, 64, 1, 4, 1, 1, 1>(BWD_PASS); }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_v1_d64(BWD_ARGS) { flash_bwd<64, 64, 1, 4, 1, 1, 1>(BWD_PASS); }
// backward, the shipped tiles (BM = 32, BN = 128, head dim 64) with other dQ orders (flash_bwd's
// ORDER, TICKET, PAIR): "atomic" = unordered adds (the kernel before the ordered reduction:
// different bits from run to run), "single" = one query tile per counter, "pair_ticket" = the
// shipped two tiles per counter with CTAs placed by a ticket, "deferred" = each tile's release
// deferred into the next iteration and the counter read early
extern "C" __global__ void __launch_bounds__(128) flash_bwd_atomic_d64(BWD_ARGS) { flash_bwd<64, 32, 2, 4, 0, 0, 1>(BWD_PASS); }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_single_d64(BWD_ARGS) { flash_bwd<64, 32, 2, 4, 1, 0, 1>(BWD_PASS); }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_pair_ticket_d64(BWD_ARGS) { flash_bwd<64, 32, 2, 4, 1, 1, 2>(BWD_PASS); }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_deferred_d64(BWD_ARGS) { flash_bwd<64, 32, 2, 4, 3, 0, 1>(BWD_PASS); }
#endif
