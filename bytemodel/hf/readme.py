"""The README.md written into an exported directory: how to load it and what the ids mean.

The Python in its "bytes" block is run by the tests (tests/test_hf.py), so it stays true.
"""
from __future__ import annotations

from ..model import n_params


def readme_text(loaded, dropped: list[str]) -> str:
    cfg, tok = loaded.cfg, loaded.tokenizer
    doc, M = tok.doc_id, tok.n_merges
    train = loaded.train or {}
    where = f"step {train.get('step')}" if train.get("step") is not None else "weights only"
    if train.get("val_bpb") is not None:
        where += f", validation {train['val_bpb']:.4f} bits/byte"
    ps = tok.pre_split
    merges = (f"ids 256..{255 + M} are the {M} byte-pair merges, in the order they apply; "
              if M else "there are no merges; ")
    split = ("Text is first cut into pieces (words, numbers, symbol runs, whitespace runs: our \"text\" "
             "pre-split, a Split pre-tokenizer here) and merges never cross a piece.\n"
             if ps else "")
    extra = ""
    if cfg.vocab_size > tok.vocab_size:
        extra = (f"The model has {cfg.vocab_size} output ids but the tokenizer {tok.vocab_size}; "
                 f"generation_config.json suppresses ids {tok.vocab_size}..{cfg.vocab_size - 1}.\n")
    mtp = ""
    if dropped:
        what = (f"its {cfg.mtp - 1} multi-token prediction heads (for tokens t+2..t+{cfg.mtp}, which "
                "`bytemodel generate --speculative` drafts with)" if cfg.mtp > 1
                else "tensors that a Llama model has no place for")
        mtp = (f"\n## Not exported\n\nThe checkpoint also holds {what}: {', '.join(dropped)}. They are left "
               "out; the next-token model is complete without them and computes the same logits.\n")
    return f"""# A bytemodel model in Hugging Face format

Exported by `bytemodel export` from the run `{loaded.path.parent.name}` ({where}).
A Llama model (`LlamaForCausalLM`): {cfg.n_layers} layers, width {cfg.d_model}, {cfg.n_heads} heads
({cfg.n_kv_heads} key/value heads), SwiGLU width {cfg.d_ff}, trained on windows of {cfg.context}
tokens, {n_params(cfg):,} parameters, float32 weights.

In the code below, THIS_DIR is the path of this directory.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained("THIS_DIR")
model = AutoModelForCausalLM.from_pretrained("THIS_DIR")
inputs = tok("Once upon a time", return_tensors="pt")   # input_ids start with <doc>
out = model.generate(**inputs, max_new_tokens=100, do_sample=True)
print(tok.decode(out[0], skip_special_tokens=True))
```

## What the ids mean

The model reads and writes bytes. Ids 0..255 are the 256 byte values; {merges}id {doc} is `<doc>`,
the document separator: it starts every text (the tokenizer adds it, as `bos`) and the model emits it
where a document ends (it is also `eos`, so `generate` stops there). `<doc>` stands for no bytes.
{split}{extra}
The tokenizer (`tokenizer.json`) is byte-level BPE. Given a string it encodes the string's UTF-8
bytes, and the ids are exactly those bytemodel gives the same bytes. The letters `<doc>` inside a
text are five ordinary bytes (`split_special_tokens` is on), never the separator.
In `tokenizer.json` every byte is written as one printable character (the GPT-2 byte alphabet:
printable Latin-1 bytes stand for themselves, the 68 others for U+0100 onwards, e.g. a space is `Ġ`).

Bytes that are not valid UTF-8 (images, audio, DNA packed as bytes, anything) cannot be passed as a
string. Encode and decode them through the alphabet instead; this gives the same ids as bytemodel:

```python bytes
from tokenizers import Tokenizer
raw = Tokenizer.from_file("THIS_DIR/tokenizer.json")
raw.normalizer = None              # the input below is already in the byte alphabet
raw.encode_special_tokens = True   # "<doc>" in the data is bytes
alphabet = [raw.id_to_token(b) for b in range(256)]       # byte b -> its character
byte_of = {{c: b for b, c in enumerate(alphabet)}}

def bytes_to_ids(data: bytes) -> list[int]:
    return raw.encode("".join(alphabet[b] for b in data), add_special_tokens=False).ids

def ids_to_bytes(ids) -> bytes:
    return bytes(byte_of[c] for i in ids if i < {doc} for c in raw.id_to_token(i))
```

## Generation beyond the context

The model was trained on windows of {cfg.context} tokens (`max_position_embeddings` in
config.json). Within that, greedy generation here gives the same bytes as
`bytemodel generate --temperature 0`. Past it the two differ: transformers keeps one growing cache
and gives positions {cfg.context}, {cfg.context + 1}, ... rotary angles the model never saw in
training, while bytemodel's generator, when its window is full, re-reads the last {cfg.context // 2}
tokens into a fresh cache at positions 0..{cfg.context // 2 - 1} and goes on, so the model always sees
windows like those it was trained on. For long outputs, slide the window the same way.

Also different by default: bytemodel's generator does not stop at `<doc>` (unless asked to) and
writes no bytes for it; transformers stops there (`eos`).
{mtp}
## Back to bytemodel

`bytemodel import-hf THIS_DIR --out RUN_DIR` turns this directory (or any Llama checkpoint whose
shapes bytemodel can represent) back into a bytemodel checkpoint, e.g. to fine-tune it.
"""
