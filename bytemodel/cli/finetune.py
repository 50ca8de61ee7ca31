"""`bytemodel finetune` and `bytemodel chat`: thin commands over bytemodel.finetune and bytemodel.chat.

``register(app)`` adds them to the main typer app (bytemodel/cli/__init__.py calls it)."""
from __future__ import annotations

import os

from pathlib import Path
from typing import Optional

import typer

from ..config import TrainConfig as D
from ..errors import ConfigError
from ..lineage import DEFAULTS
from .errors import a_folder, either, user_errors


def finetune(
    ctx: typer.Context,
    parent: Optional[Path] = typer.Option(None, "--from", help="The run (or checkpoint) whose weights to start from."),
    source: Optional[str] = typer.Option(None, "--source", "-s", help="Plain data to continue training on."),
    pairs: Optional[Path] = typer.Option(None, "--pairs", help="JSONL of {\"prompt\", \"completion\"}: loss on completions."),
    chat: Optional[Path] = typer.Option(None, "--chat", help="JSONL of {\"messages\": [...]}: loss on assistant turns."),
    val: Optional[Path] = typer.Option(None, "--val", help="Held-out examples (JSONL like the training file; "
                                                         "default: hold out --val-fraction of them)."),
    steps: Optional[int] = typer.Option(None, help=f"Optimizer steps (default {DEFAULTS['steps']}; on --resume, the run's own)."),
    batch_size: int = typer.Option(D.batch_size, "--batch-size", "-b", help="Windows per step (0: the preset of the parent's width's; tiny 16, small/base 32)."),
    lr: float = typer.Option(DEFAULTS["lr"], help="Peak learning rate (warmup then cosine decay)."),
    warmup: int = typer.Option(DEFAULTS["warmup"], help="Warmup steps."),
    weight_decay: float = typer.Option(D.weight_decay, "--weight-decay", help="AdamW decoupled weight decay."),
    grad_clip: float = typer.Option(D.grad_clip, "--grad-clip", help="Global gradient-norm clip (0: off)."),
    seed: int = typer.Option(D.seed, help="Seed for the batch sampler and the held-out split."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Run directory (default: runs/<source>-N)."),
    resume: bool = typer.Option(False, help="Continue the fine-tune in --out exactly where it stopped."),
    device: Optional[str] = typer.Option(None, help=f"cpu, cuda or auto (default {D.device}; on --resume, the run's own)."),
    precision: Optional[str] = typer.Option(None, help="fp32 (CPU), or fp16 / bf16 on cuda (default auto; on --resume, the run's own: another is used from that step on, with a note)."),
    reader: str = typer.Option(D.reader, help="Reader for --source (default: detected from the file)."),
    workers: int = typer.Option(D.workers, help="CPU threads, each training a slice of the batch (0: one per core)."),
    eval_every: int = typer.Option(D.eval_every, "--eval-every", help="Steps between validation + checkpoint (0: the preset of the parent's width's; tiny 100, small/base 250)."),
    eval_tokens: int = typer.Option(D.eval_tokens, "--eval-tokens", help="Validation tokens scored each time (0: at most 2097152 evenly spread on a GPU, 131072 on the CPU)."),
    val_fraction: float = typer.Option(D.val_fraction, "--val-fraction", help="Share of the data held out."),
    dropout: Optional[float] = typer.Option(None, "--dropout", help="Dropout on the embedding and every residual "
                                            "branch, P in [0, 0.9] (default: the parent's)."),
    dropout_attn: Optional[float] = typer.Option(None, "--dropout-attn", help="Dropout on the attention "
                                                 "probabilities, P in [0, 0.9] (default: the parent's)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
):
    """Fine-tune a trained run on new data, pairs or conversations, into a new run directory.

    The new run starts from the parent's weights with a fresh optimizer and its own schedule, keeps
    its tokenizer, and records the parent. With --pairs / --chat the loss counts only completions /
    assistant turns, and validation is bits/byte of the held-out ones.
    Example: bytemodel finetune --from runs/jargon-1 --pairs defs.jsonl --steps 300
    """
    from ..training.finetune import finetune as api_finetune, parent_val_bpb
    with user_errors():
        given = [(k, v) for k, v in (("source", source), ("pairs", pairs), ("chat", chat)) if v]
        if resume:
            if given or parent:
                raise ConfigError("--resume continues the fine-tune in --out as it was set up: "
                                  "drop --from / --source / --pairs / --chat")
        elif len(given) != 1:
            raise ConfigError("give exactly one of --source DATA, --pairs FILE or --chat FILE")
        elif parent is None:
            raise ConfigError("give the run to start from: --from RUN")
        if steps is not None and steps <= 0:
            raise ConfigError(f"steps must be positive, got {steps}")
        kind, data = given[0] if given else ("", None)
        settings = dict(batch_size=batch_size, lr=lr, warmup=warmup, weight_decay=weight_decay,
                        grad_clip=grad_clip, seed=seed, device=device or ("" if resume else D.device),
                        precision=precision or ("" if resume else D.precision), reader=reader,
                        workers=workers, eval_every=eval_every, eval_tokens=eval_tokens,
                        val_fraction=val_fraction)
        if steps is not None:
            settings["steps"] = steps
        for name, value in (("dropout", dropout), ("dropout_attn", dropout_attn)):
            if value is not None:            # else the parent's (TrainConfig's -1)
                if resume:
                    raise ConfigError(f"--{name.replace('_', '-')} is set up with the fine-tune; --resume keeps it")
                settings[name] = value
        if resume:   # the settings given on the command line: those the run keeps its own of get a note
            settings = {k: v for k, v in settings.items() if k in ("device", "precision", "steps")
                        or ctx.get_parameter_source(k).name == "COMMANDLINE"}
        res = api_finetune(parent, data, a_folder(out, "--out"), examples=kind if kind != "source" else "",
                           val_source=val or "", resume=resume, progress=not quiet, log=typer.echo, **settings)
        typer.echo(f"step {res.step}: validation {res.val_bpb:.4f} bits/byte; checkpoint {res.checkpoint}")
        if res.interrupted:
            raise typer.Exit(130)
        if not resume:
            before = parent_val_bpb(res.run_dir)
            what = "completions" if kind == "pairs" else "assistant turns" if kind == "chat" else "tail"
            typer.echo(f"held-out {what}, bits/byte: parent {before:.4f} -> fine-tuned {res.val_bpb:.4f}")


def chat(
    run: Optional[Path] = typer.Argument(None, help="Run directory or checkpoint (default: latest run)."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", "-c", show_default=False,
                                              help="The same as RUN (as generate and score take it)."),
    system: str = typer.Option("", "--system", help="A system message to start every conversation with."),
    temperature: float = typer.Option(0.8, "--temperature", "-t", help="0 = greedy."),
    top_k: int = typer.Option(0, "--top-k", help="Keep the k likeliest ids (0: off)."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass (1: off)."),
    seed: int = typer.Option(0, help="Sampling seed: the same inputs and seed give the same replies."),
    max_bytes: int = typer.Option(1024, "--max-bytes", help="Longest reply in bytes."),
    device: str = typer.Option("cpu", help="cpu, cuda or auto."),
):
    """Chat with a model fine-tuned on conversations (--chat): one line in, the reply streamed out.

    Ctrl-D (or the end of piped input) ends the session; Ctrl-C stops a reply, or at the prompt
    ends the session; /reset starts a new conversation. The conversation is kept within the
    model's context window (oldest turns dropped first).
    Example: printf 'what is cruft?\\n' | bytemodel chat runs/chat-1 --temperature 0
    """
    from .. import load
    from ..chat import Chat, repl
    with user_errors():
        lm = load(either(run, checkpoint, "runs", "--checkpoint"), device=device)
        # the system message's bytes as given ($'\xff\xfe' arrives surrogate-escaped)
        c = Chat(lm.model, lm.tokenizer, os.fsencode(system) or None, temperature, top_k, top_p, seed, max_bytes)
        code = repl(c, banner=f"chat with {lm.path} (context {lm.cfg.context} tokens); Ctrl-D to end")
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command()(finetune)
    app.command()(chat)
