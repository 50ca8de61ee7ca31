"""The preset dictionary of a .bmz header (container version 4 on).

A header is a small JSON object (its keys and most values the same in every file), deflated on
its own: plain zlib leaves about 700 bytes of it, more than 1% of a 64 KB file's output. Deflated
against this dictionary (zlib's preset dictionary: a compressor and decompressor that both hold it
may copy from it as from text already seen) a typical header takes about 200. The text is headers
of every kind (static and adapting, from a checkpoint or a preset, the CPU and a GPU, each view),
with their digests and counts zeroed; zlib's matches are cheapest near its end, so the commonest
come last.

FROZEN: every version 4 file was deflated against exactly these bytes (tests/test_compress.py pins
their SHA-256). Another dictionary needs another container version, and this one kept for reading.
"""

HEADER_ZDICT = (
    b'"reader":"image:tile=32","view":{"coded":{"bytes":0,"sha256":"0000000000000000000000000000000000'
    b'000000000000000000000000000000"},"coder":"xz","format":"png","kind":"content","layout_bytes":0,"'
    b'why":"the image reader has no exact split of this file"}"backend":{"cublas_atomics":0,"cupy":"14'
    b'.0.0","device":"cuda","gpu":"NVIDIA H200","precision":"bf16","sm_count":132}"layout":{"engine":"'
    b'lockstep","lane":1024,"order":"step-major, streams in order","reread":0,"streams":1024,"tokens":'
    b'1000000,"window":512}"reader":"audio:encoding=pcm16,rate=8000","reader":"audio:encoding=mulaw","'
    b'reader":"fasta","reader":"raw","reader":"text","why":"the fasta reader\'s documents hold only 0% '
    b'of the file","why":"the text reader\'s document is the file"{"adapt":{"beta1":0.9,"beta2":0.99,"c'
    b'lip":1.0,"eps":1e-08,"lookback":8,"lr":0.002,"mix":"none","optimizer":"sgd","segment":32,"start"'
    b':"preset:tiny","stride":8,"weight_decay":0.0},"checkpoint":{"file":"","name":"","tokenizer_sha25'
    b'6":"0000000000000000000000000000000000000000000000000000000000000000","weights_sha256":"00000000'
    b'00000000000000000000000000000000000000000000000000000000"},{"adapt":null,"backend":{"blas":"open'
    b'blas 0.3.31.188.0 SkylakeX","device":"cpu","numpy":"2.4.6","precision":"fp32"},"checkpoint":{"fi'
    b'le":"best.safetensors","name":"","tokenizer_sha256":"0000000000000000000000000000000000000000000'
    b'000000000000000000000","weights_sha256":"0000000000000000000000000000000000000000000000000000000'
    b'000000000"},"coder":{"alphabet":256,"group_words":[0],"model":"Categorical(perfect=False)","name'
    b'":"constriction.stream.queue.RangeEncoder","precision_bits":24,"version":"0.5.0"},"format":"byte'
    b'model-compressed","layout":{"engine":"cpu","lane":128,"order":"step-major, streams in order","re'
    b'read":0,"streams":256,"tokens":0,"window":32},"original":{"bytes":0,"sha256":"000000000000000000'
    b'0000000000000000000000000000000000000000000000"},"payload_bytes":0,"reader":"fasta","version":4,'
    b'"view":{"coded":{"bytes":0,"sha256":"00000000000000000000000000000000000000000000000000000000000'
    b'00000"},"coder":"zlib","format":"","kind":"split","layout_bytes":0,"why":""}}{"adapt":{"beta1":0'
    b'.9,"beta2":0.99,"clip":1.0,"eps":1e-08,"lookback":8,"lr":0.0003,"mix":"ctx3","optimizer":"adamw"'
    b',"segment":32,"start":"checkpoint","stride":1,"weight_decay":0.0},"backend":{"blas":"openblas 0.'
    b'3.31.188.0 SkylakeX","device":"cpu","numpy":"2.4.6","precision":"fp32"},"checkpoint":{"file":"be'
    b'st.safetensors","name":"","tokenizer_sha256":"00000000000000000000000000000000000000000000000000'
    b'00000000000000","weights_sha256":"00000000000000000000000000000000000000000000000000000000000000'
    b'00"},"coder":{"alphabet":256,"group_words":[0],"model":"Categorical(perfect=False)","name":"cons'
    b'triction.stream.queue.RangeEncoder","precision_bits":24,"version":"0.5.0"},"format":"bytemodel-c'
    b'ompressed","layout":{"engine":"cpu","lane":32,"order":"step-major, streams in order","reread":0,'
    b'"streams":64,"tokens":0,"window":32},"original":{"bytes":0,"sha256":"000000000000000000000000000'
    b'0000000000000000000000000000000000000"},"payload_bytes":0,"reader":"text","version":4,"view":{"c'
    b'oded":{"bytes":0,"sha256":"0000000000000000000000000000000000000000000000000000000000000000"},"c'
    b'oder":"none","format":"","kind":"as-is","layout_bytes":0,"why":""}}'
)
