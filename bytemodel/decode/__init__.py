"""The decoding wing: sampling and scoring with a KV cache (decode/generate.py), self-speculative decoding
with the multi-token heads (decode/speculative.py), and many streams advanced together through one batched
cache (decode/lockstep.py), which the compressor drives."""
