"""Fine-tuning: learn term -> definition from the Jargon File, on top of a model pretrained on it.

    apt-get install jargon-text            # provides /usr/share/doc/jargon-text/jargon.txt.gz
    python examples/finetune_jargon.py     # 400 + 200 steps: 29 minutes on a loaded 2-core CPU
    python examples/finetune_jargon.py --steps 20     # smoke test

1. The glossary's 2,307 entries (":term: pos." then the definition) are split: 100 held out
   (seeded), the rest for training.
2. Pretrain a tiny model (--steps, default 400, of 8 windows) on the training entries' text, in the file's own layout (the held-out
   entries are left out, so their definitions are never seen).
3. Fine-tune it on the training entries as question -> answer pairs,
       prompt      'What does "TERM" mean?\n'
       completion  'n. The first sentences of the definition, up to 200 bytes.'
   with the loss on the completions only (bytemodel finetune --pairs), for steps/2 steps.
4. Score the 100 held-out completions (bits/byte given their prompts) under the pretrained and
   the fine-tuned model, and answer a few held-out questions (greedy, up to 200 bytes).
Writes pairs_train.jsonl / pairs_held_out.jsonl, both runs, and result.json to the output folder.
"""
from __future__ import annotations

import json
import re
import time

import numpy as np

from _common import fetch, out_dir, parse_args, stream_of

import bytemodel
from bytemodel.training.finetune import finetune
from bytemodel.pairs import read_examples, score_examples

HELD_OUT = 100
MAX_COMPLETION = 200    # bytes: prompt + completion fit the tiny preset's 256-token context
ENTRY = re.compile(r"^   :([^:\n]+):(.*)$")


def entries(text: str) -> list[tuple[str, str, str]]:
    """The glossary as (term, header rest, body): a header line '   :term: rest', then the body up
    to the next header or a section title (indented further)."""
    out, cur = [], None
    for line in text.splitlines():
        m = ENTRY.match(line)
        if m:
            cur = [m.group(1), m.group(2).strip(), []]
            out.append(cur)
        elif cur is not None:
            if line.startswith(" " * 10) and line.strip():   # "Part III. Appendices": the glossary ends
                cur = None
                continue
            cur[2].append(line[3:] if line.startswith("   ") else line)
    return [(t, h, "\n".join(b).strip()) for t, h, b in out]


def first_sentences(body: str, limit: int = MAX_COMPLETION) -> str:
    """The first paragraph, whitespace collapsed, cut after the last sentence that fits (or a word)."""
    para = " ".join(body.split("\n\n")[0].split())
    if len(para.encode()) <= limit:
        return para
    cut = para.encode()[:limit].decode("utf-8", "ignore")
    end = max(cut.rfind(". "), cut.rfind("? "), cut.rfind("! "))
    return cut[:end + 1] if end > limit // 3 else cut[:cut.rfind(" ")]


def pair(term: str, header: str, body: str) -> dict:
    answer = " ".join(x for x in (header.strip("/ ").split("/")[-1].strip(" ,"), first_sentences(body)) if x)
    return {"prompt": f'What does "{term}" mean?\n', "completion": answer[:MAX_COMPLETION * 2]}


args = parse_args(__doc__.splitlines()[0], steps=400)
out = out_dir(args, "finetune_jargon", fresh=("pre", "ft"))
text = stream_of(fetch("jargon"), "text").decode("utf-8")
ents = [e for e in entries(text) if e[2]]
held = set(np.random.default_rng(args.seed).permutation(len(ents))[:HELD_OUT].tolist())
train_e = [e for i, e in enumerate(ents) if i not in held]
held_e = [e for i, e in enumerate(ents) if i in held]
print(f"{len(ents)} entries: {len(train_e)} for training, {len(held_e)} held out")

(out / "pretrain.txt").write_text("".join(f":{t}: {h}\n\n{b}\n\n" for t, h, b in train_e))
for name, es in (("pairs_train.jsonl", train_e), ("pairs_held_out.jsonl", held_e)):
    with open(out / name, "w") as f:
        for e in es:
            f.write(json.dumps(pair(*e)) + "\n")

log = lambda m: print(m, flush=True)  # noqa: E731
t0 = time.time()
pre = bytemodel.train(out / "pretrain.txt", out / "pre", reader="text", preset="tiny", steps=args.steps,
                      batch_size=8, seed=args.seed, eval_every=max(1, args.steps), log=log)
t1 = time.time()
ft_steps = max(1, args.steps // 2)
ft = finetune(out / "pre", out / "pairs_train.jsonl", out / "ft", examples="pairs",
              val_source=out / "pairs_held_out.jsonl", steps=ft_steps, batch_size=8, lr=1e-3, warmup=20,
              seed=args.seed, eval_every=max(1, ft_steps), log=log)
t2 = time.time()

held_pairs = read_examples(out / "pairs_held_out.jsonl", "pairs")
before, after = (score_examples(bytemodel.load(r.run_dir).model, bytemodel.load(r.run_dir).tokenizer,
                                held_pairs, "pairs") for r in (pre, ft))
print(f"\nheld-out completions ({len(held_pairs)} definitions, {after['bytes']:,} bytes), bits/byte:")
print(f"  pretrained ({pre.step} steps on the text)          {before['bits_per_byte']:.3f}")
print(f"  fine-tuned (+{ft.step} steps on question -> answer) {after['bits_per_byte']:.3f}")

lm = bytemodel.load(ft.run_dir)
samples = []
for prompt, truth in held_pairs[:5]:
    ans = lm.generate(MAX_COMPLETION, prompt=prompt, temperature=0, stop_at_doc_end=True)
    samples.append({"prompt": prompt.decode(), "answer": ans.decode("utf-8", "replace"), "truth": truth.decode()})
    print(f"\n{prompt.decode().strip()}\n  model: {ans.decode('utf-8', 'replace')}\n  file:  {truth.decode()}")

result = {"example": "finetune_jargon", "entries": len(ents), "held_out": len(held_pairs),
          "pretrain_steps": pre.step, "finetune_steps": ft.step, "pretrain_val_bpb": pre.val_bpb,
          "held_out_bpb_pretrained": before["bits_per_byte"], "held_out_bpb_finetuned": after["bits_per_byte"],
          "held_out_bytes": after["bytes"], "pretrain_seconds": round(t1 - t0), "finetune_seconds": round(t2 - t1),
          "samples": samples, "time": time.strftime("%Y-%m-%d %H:%M")}
(out / "result.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
