"""`lablib`: the lab's operations without a notebook, one module per subcommand.

    lablib doctor                      is each engine usable here, and why not
    lablib prepare [MODEL]             resolve a model, derive its formats (cached)
    lablib run --engine NAME [--model M] [--prompt TEXT | --chat TEXT | --prompt-tokens N]
               --max-new-tokens N [--json]
    lablib sweep context --engines a,b,c --prompt-tokens 64,256,1024 --max-new-tokens N
               --reps N [--model M] --out FILE
    lablib sweep concurrency --engines a,b,c --concurrency 1,2,4,8 --mode serial,batched
               --requests R --prompt-tokens N --max-new-tokens N [--model M] --out FILE
    lablib report FILE... --html OUT
    lablib merge FILE... --out ALL
    lablib compare [--model M] [--engines a,b,c] [--reference ENGINE]
               (--prompt TEXT | --messages FILE | --ids FILE) [--json]
    lablib serve --server NAME [--port P] [--parallel N]      a real server on the lab's model
    lablib bench --base-url URL [--model ID] [--rate R | --concurrency C] --requests N
               --prompt-tokens P --max-new-tokens M --out FILE   load on any OpenAI-compatible server
    lablib replay (--base-url URL | --server NAME) [--trace FILE] [--start I] [--count N]
               [--time-scale X] [--length-scale X] --out FILE        a request trace (Mooncake's), scaled
    lablib roofline [--results FILE...] [--engines a,b,c] [--refresh] [--json]
    lablib quantize [--types Q8_0,Q4_K_M,...] [--model M] [--out FILE]   the quantization ladder, measured
    lablib quality --engine E [--model M] [--variant V] --out FILE       one engine vs the F32 reference
    lablib prefix [--engines a,b,c] [--shared-tokens 64,256] [--turns N] [--json]   prefix caching (lab 08)
    lablib structured --engine E [--schema FILE...] [--regex RE] [--max-new-tokens N] [--out FILE]   lab 10's grammars
    lablib speculate [--engine a,b] [--draft Q4_0] [--k 2,4] [--text prose] [--out FILE]   speculative decoding (lab 10)
    lablib lora [--engines a,b] [--servers llama-server,vllm] [--ranks 8,64] [--out FILE]   LoRA adapters (lab 11)

A subcommand is one module ``lablib/cli/<name>.py`` with ``HELP`` (its one-line help),
``add_arguments(p)`` (its flags on an argparse parser) and ``run(ns) -> int`` (the exit code),
listed in :data:`COMMANDS` in the order ``lablib --help`` shows them. A command module prints;
what it computes lives in the library (pattern: mlx-lm's and vLLM's CLI subcommand modules).
Errors the user can act on (LabError) print one message and exit 2. The library names what it refuses by its
Python keyword (``max_new_tokens=0``); :func:`in_flags` rewrites each ``keyword=`` as the flag the user typed
(``--max-new-tokens 0``): a flag's own name, or where the keyword differs from it, the command module's
``keywords(ns)`` ({keyword: flag}).
"""

from __future__ import annotations

import argparse
import importlib
import re
import signal
import sys
from pathlib import Path

from lablib.children import first_interrupt_only
from lablib.errors import LabError

COMMANDS = (
    "doctor",
    "prepare",
    "run",
    "sweep",
    "report",
    "merge",
    "compare",
    "serve",
    "bench",
    "replay",
    "roofline",
    "quantize",
    "quality",
    "prefix",
    "structured",
    "speculate",
    "lora",
)


def build_parser() -> argparse.ArgumentParser:
    """The ``lablib`` parser: one subparser per module of :data:`COMMANDS`, its ``run`` as ``func``."""
    ap = argparse.ArgumentParser(prog="lablib", description="Inference Engine Lab")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in COMMANDS:
        mod = importlib.import_module(f"lablib.cli.{name}")
        p = sub.add_parser(name, help=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(func=mod.run, flag_names=_flag_names(p))
    return ap


def _flag_names(p: argparse.ArgumentParser) -> dict[str, str]:
    """{dest: its long flag} of a subcommand's options (``max_new_tokens``: ``--max-new-tokens``)."""
    out = {}
    for action in p._actions:
        long = [s for s in action.option_strings if s.startswith("--")]
        if long and action.dest != "help":
            out[action.dest] = long[0]
    return out


def in_flags(message: str, names: dict[str, str]) -> str:
    """``message`` with each ``keyword=`` of ``names`` ({keyword: flag}) as the flag: "max_new_tokens=0: expected
    at least 1 token" as "--max-new-tokens 0: expected at least 1 token" (a library's refusal, as the command line
    says it); other words are left as they are."""
    if not names:
        return message
    keys = "|".join(re.escape(k) for k in sorted(names, key=len, reverse=True))
    # not inside a word, a path or a quoted value (a folder "runs/rate=2/" stays as typed)
    return re.sub(rf"(?<![\w.\-/\\'\"])({keys})=\s?", lambda m: f"{names[m.group(1)]} ", message)


def _names(ns) -> dict[str, str]:
    """The keyword -> flag names of ``ns``'s subcommand: its flags', then its module's ``keywords(ns)``."""
    names = dict(getattr(ns, "flag_names", None) or {})
    keywords = getattr(importlib.import_module(f"lablib.cli.{ns.cmd}"), "keywords", None)
    if keywords is not None:
        names.update(keywords(ns))
    return names


def _size(out) -> int | None:
    """The size of results file ``out`` in bytes; None where there is none (or no --out)."""
    try:
        return Path(out).stat().st_size if out else None
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    """``lablib ...``: the command of ``argv`` (None: this process's own arguments), its exit code. As a process's
    command (``argv`` None), SIGTERM is taken as Ctrl-C from the start (one line, the servers it started stopped by
    the lab; was: a silent death, its servers left to their death signal) and a second signal is dropped until that
    line is printed, and past it when the command was interrupted (its process's exit: servers' stops, the
    interpreter's teardown; was: a second Ctrl-C on the way out killed the process by SIGINT):
    :func:`lablib.children.first_interrupt_only`. Called from Python with ``argv``, the caller's handlers are left
    as they are (a script's SIGTERM still ends the script)."""
    if argv is not None:
        return _main(argv)
    with first_interrupt_only():
        try:
            rc = _main(argv)
        except KeyboardInterrupt as e:  # the first signal in the instant the command ended, past its own handling
            rc = 143 if e.args == ("SIGTERM",) else 130
        if rc in (130, 143):
            ignore_interrupts_from_now()
    return rc


def ignore_interrupts_from_now() -> None:
    """SIGINT and SIGTERM ignored for the rest of this process (its exit), past the end of the
    :func:`lablib.children.first_interrupt_only` block this is called in (which leaves a handler set inside it)."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)


def _main(argv) -> int:
    try:  # the commands' flags: a quarter of a second of imports, where a Ctrl-C printed a traceback
        ns = build_parser().parse_args(argv)
    except KeyboardInterrupt as e:
        name = "SIGTERM" if e.args == ("SIGTERM",) else "Ctrl-C"
        print(f"lablib: interrupted ({name}) before the command began; nothing was done", file=sys.stderr, flush=True)
        return 143 if name == "SIGTERM" else 130
    out = getattr(ns, "out", None)
    return _run(ns, out, _size(out))


def _run(ns, out, size_before) -> int:
    try:
        return ns.func(ns)
    except LabError as e:
        print(f"lablib: {in_flags(str(e), _names(ns))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (children.first_interrupt_only; bench, replay and serve
        # say more, themselves): the rows written stay where they are
        name = "SIGTERM" if e.args == ("SIGTERM",) else "SIGINT"
        size = _size(out)
        if not out:
            kept = "nothing was written"
        elif size is None:
            kept = f"no results file was written (it would be {out})"
        elif size == size_before:
            kept = f"no rows were added to {out} (its earlier rows are as they were)"
        else:
            kept = f"the rows written before it are in {out}"
        print(
            f"lablib {ns.cmd}: interrupted ({'Ctrl-C' if name == 'SIGINT' else name}); {kept}",
            file=sys.stderr,
            flush=True,
        )
        return 130 if name == "SIGINT" else 143


if __name__ == "__main__":
    raise SystemExit(main())
