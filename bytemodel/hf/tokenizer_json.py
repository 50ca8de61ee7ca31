"""Our tokenizer as a Hugging Face `tokenizers` file (tokenizer.json), and back.

How bytes become ids there, so that every id means what it means here:

- The `tokenizers` library works on text. Its ByteLevel normalizer turns the text into its UTF-8
  bytes and writes each byte as one printable character (the GPT-2 byte alphabet: bytes that are
  printable and not a space in Latin-1 stand for themselves; the other 68 bytes, in increasing
  order, take the characters U+0100, U+0101, ...). `byte_alphabet()` builds the same map.
- The BPE vocabulary then names id b (0..255) by the character of byte b, and id 256 + i (merge i)
  by the characters of its bytes. The merges are listed in our order, so "merge the lowest-ranked
  pair present" (what `tokenizers` does) is our own rule; `ignore_merges` is off, so a word that is
  itself in the vocabulary is still built pair by pair, as here.
- Our "text" pre-split (bytemodel.tokenizer.pretok.TEXT_PATTERN, a regex over bytes) becomes a Split
  pre-tokenizer whose regex is the same pattern written over the byte alphabet: each byte class of
  the original becomes the class of the characters standing for those bytes (text_split_regex()).
- `<doc>` (id 256 + M) is an added special token; the post-processor puts it before every text,
  as our generator and scorer do. tokenizer_config.json sets split_special_tokens, so the letters
  "<doc>" inside a text are encoded as bytes (as here), never as the special id.

Text that is not valid UTF-8 cannot be passed to a `tokenizers` tokenizer as a string; such bytes
go through the alphabet directly (the README written beside the export shows the four lines).
"""
from __future__ import annotations

import re

from ..errors import TokenizerError
from ..tokenizer import SPECIALS, Tokenizer

DOC = SPECIALS[0]


def byte_alphabet() -> list[str]:
    """[256] the character that stands for each byte in the ByteLevel alphabet."""
    keep = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    out, n = [""] * 256, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def token_string(data: bytes, alphabet: list[str] | None = None) -> str:
    """A token's bytes written in the byte alphabet."""
    a = alphabet or byte_alphabet()
    return "".join(a[b] for b in data)


def _cls(byte_class: bytes) -> str:
    """A bytes regex class (e.g. rb"[0-9]") -> the class of the characters standing for those bytes."""
    pat = re.compile(byte_class)
    a = byte_alphabet()
    chars = [a[b] for b in range(256) if pat.fullmatch(bytes([b]))]
    return "[" + "".join(f"\\x{{{ord(c):X}}}" for c in chars) + "]"


def text_split_regex() -> str:
    """TEXT_PATTERN of bytemodel.tokenizer.pretok, rewritten over the byte alphabet (Oniguruma syntax).

    The byte pattern, piece by piece:   '(?:[sdmt]|ll|ve|re) | ?L+ | ?N{1,3} | ?O+ | S+(?!\\S) | S+
    with L = [A-Za-z\\x80-\\xff], N = [0-9], S = \\s (Python bytes: [ \\t\\n\\r\\x0b\\x0c]) and O the
    rest. Apostrophe and the letters s d m t l v e r stand for themselves in the alphabet.
    """
    sp = f"\\x{{{ord(byte_alphabet()[0x20]):X}}}"
    L, N = _cls(rb"[A-Za-z\x80-\xff]"), _cls(rb"[0-9]")
    S, O = _cls(rb"\s"), _cls(rb"[^\sA-Za-z0-9\x80-\xff]")
    nonspace = _cls(rb"\S")
    return (f"'(?:[sdmt]|ll|ve|re)|{sp}?{L}+|{sp}?{N}{{1,3}}|{sp}?{O}+|{S}+(?!{nonspace})|{S}+")


# pre_split name -> the Split regex over the byte alphabet
SPLITS = {"text": text_split_regex}


def _check_exportable(tok: Tokenizer) -> None:
    seen: dict[bytes, int] = {}
    for i, v in enumerate(tok.vocab[:256 + tok.n_merges]):
        if v in seen:
            raise TokenizerError(f"ids {seen[v]} and {i} both stand for the bytes {v!r}; the Hugging Face "
                                 "format names each token by its bytes, so this tokenizer cannot be exported")
        seen[v] = i
    ps = tok.pre_split
    if ps is not None and ps not in SPLITS:
        raise TokenizerError(f"pre-split {ps!r} has no Hugging Face equivalent here (known: {', '.join(SPLITS)})")


def tokenizer_json(tok: Tokenizer) -> dict:
    """The tokenizer.json object (tokenizers' serialisation, version 1.0)."""
    _check_exportable(tok)
    a = byte_alphabet()
    names = [token_string(v, a) for v in tok.vocab[:256 + tok.n_merges]]
    doc = tok.doc_id
    ps = tok.pre_split
    pre = None if ps is None else {"type": "Split", "pattern": {"Regex": SPLITS[ps]()},
                                   "behavior": "Isolated", "invert": False}
    special = {"SpecialToken": {"id": DOC, "type_id": 0}}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": doc, "content": DOC, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": {"type": "ByteLevel"},
        "pre_tokenizer": pre,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [special, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [special, {"Sequence": {"id": "A", "type_id": 0}}, special, {"Sequence": {"id": "B", "type_id": 0}}],
            "special_tokens": {DOC: {"id": DOC, "ids": [doc], "tokens": [DOC]}},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {s: i for i, s in enumerate(names)},
            # "a b" strings: no character of the alphabet is a space, so the split is unambiguous
            "merges": [f"{names[x]} {names[y]}" for x, y in tok.merges],
        },
    }


def tokenizer_config(tok: Tokenizer, context: int) -> dict:
    """tokenizer_config.json: the class AutoTokenizer builds and the special tokens' roles."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": DOC,
        "eos_token": DOC,
        "pad_token": DOC,
        "model_max_length": context,
        "split_special_tokens": True,          # "<doc>" typed in a text is five bytes, as here
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(tok.doc_id): {"content": DOC, "lstrip": False, "normalized": False,
                                                   "rstrip": False, "single_word": False, "special": True}},
    }


def special_tokens_map() -> dict:
    return {"bos_token": DOC, "eos_token": DOC, "pad_token": DOC}


# ---------------------------------------------------------------------------------------- reading
def read_tokenizer_json(d: dict, where: str) -> Tokenizer:
    """A tokenizer.json in our layout (as tokenizer_json writes it) -> Tokenizer; else TokenizerError.

    Accepted: a BPE model whose ids 0..255 are the 256 bytes in the byte alphabet, each merge i
    making id 256 + i, `<doc>` right after the merges, a ByteLevel normalizer or pre-tokenizer
    without its own regex split, and either no further pre-tokenizer or our text split.
    """
    def bad(why: str) -> TokenizerError:
        return TokenizerError(f"{where}: {why}; bytemodel reads only byte-level vocabularies whose ids "
                              "0..255 are the bytes (as `bytemodel export` writes them)")

    if not isinstance(d, dict):
        raise bad("not a tokenizer object")
    m = d.get("model")
    if not isinstance(m, dict) or m.get("type") != "BPE":
        raise bad(f"the model is {m.get('type') if isinstance(m, dict) else m!r}, not BPE")
    if m.get("ignore_merges") or m.get("byte_fallback") or m.get("continuing_subword_prefix") \
            or m.get("end_of_word_suffix") or m.get("dropout"):
        raise bad("BPE options that change how merges apply (ignore_merges, byte_fallback, prefixes, dropout)")
    vocab = m.get("vocab")
    if not isinstance(vocab, dict):
        raise bad("no vocabulary")
    a = byte_alphabet()
    if any(vocab.get(a[b]) != b for b in range(256)):
        raise bad("ids 0..255 are not the 256 bytes")
    merges = []
    for i, mg in enumerate(m.get("merges") or []):
        if isinstance(mg, str):
            parts = mg.split(" ")
        elif isinstance(mg, (list, tuple)):
            parts = list(mg)
        else:
            parts = []
        if len(parts) != 2 or not all(isinstance(p, str) for p in parts):
            raise bad(f"merge {i} is not a pair of tokens")
        x, y = vocab.get(parts[0]), vocab.get(parts[1])
        z = vocab.get(parts[0] + parts[1])
        if x is None or y is None or z != 256 + i:
            raise bad(f"merge {i} ({parts[0]!r} + {parts[1]!r}) does not make id {256 + i}")
        merges.append((x, y))
    n_vocab = 256 + len(merges)
    if len(vocab) != n_vocab:
        raise bad(f"{len(vocab)} vocabulary entries for {len(merges)} merges")
    added = [t for t in d.get("added_tokens") or [] if isinstance(t, dict)]
    if [(t.get("id"), t.get("content")) for t in added] not in ([], [(n_vocab, DOC)]):
        raise bad(f"added tokens other than {DOC} at id {n_vocab}")
    pre_split = _read_pre_split(d, bad)
    return Tokenizer(merges, pre_split)


def _read_pre_split(d: dict, bad) -> str | None:
    """Which of our pre-splits the normalizer + pre-tokenizer amount to (None: none)."""
    norm, pre = d.get("normalizer"), d.get("pre_tokenizer")
    steps = pre.get("pretokenizers") if isinstance(pre, dict) and pre.get("type") == "Sequence" else \
        ([] if pre is None else [pre])
    byte_level = isinstance(norm, dict) and norm.get("type") == "ByteLevel"
    if norm is not None and not byte_level:
        raise bad(f"normalizer {norm.get('type') if isinstance(norm, dict) else norm!r}")
    split = None
    for s in steps:
        kind = s.get("type") if isinstance(s, dict) else None
        if kind == "ByteLevel" and not byte_level and split is None:
            if s.get("use_regex", True) or s.get("add_prefix_space", False):
                raise bad("a ByteLevel pre-tokenizer that also splits or adds a prefix space")
            byte_level = True
        elif kind == "Split" and byte_level and split is None:
            pat = (s.get("pattern") or {}).get("Regex")
            names = [n for n, f in SPLITS.items() if f() == pat]
            if not names or s.get("behavior") != "Isolated" or s.get("invert"):
                raise bad("a pre-tokenizer split that is not one of ours")
            split = names[0]
        else:
            raise bad(f"pre-tokenizer {kind!r} here")
    if not byte_level:
        raise bad("no ByteLevel normalizer or pre-tokenizer")
    return split
