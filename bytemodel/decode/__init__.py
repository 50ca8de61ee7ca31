"""The decoding wing: sampling and scoring with a KV cache (generate.py), self-speculative decoding
with the multi-token heads (speculative.py), many streams advanced together through one batched
cache (lockstep.py), which the compressor drives, and the window rule they share (window.py)."""
