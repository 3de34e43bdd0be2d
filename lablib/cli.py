"""`lablib`: the lab's operations without a notebook.

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

Errors the user can act on (LabError) print one message and exit 2.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from .errors import LabError

DEFAULT_CHAT = "What is the capital of France?"


# --- doctor -------------------------------------------------------------------------
def cmd_doctor(ns) -> int:
    from . import __version__
    from .doctor import check_engines
    from .hardware import hardware_info
    from .models import prepare

    hw = hardware_info()
    print(f"lablib {__version__}, Python {hw['python']}, {hw['os']} {hw['machine']}")
    print(f"CPU: {hw['cpu_model']}, {hw['cores_physical']} cores, RAM {hw['ram_bytes'] / 2**30:.1f} GiB, "
          f"accelerator: {hw['accelerator'] or 'none'}")
    if hw["cpu_quota"] or hw["memory_limit_bytes"]:
        limit = hw["memory_limit_bytes"]
        print(f"container caps: CPU {hw['cpu_quota'] or 'no cap'}"
              f"{' CPUs' if hw['cpu_quota'] else ''}, memory "
              f"{f'{limit / 2**30:.1f} GiB' if limit else 'no cap'}")
    from .engines.base import default_threads
    from .hardware import available_ram_bytes

    print(f"engines will use {default_threads()} threads; {available_ram_bytes() / 2**30:.1f} GiB free for them")
    try:
        rm = prepare(ns.model, log=lambda *_: None)
        print(f"model: {rm.name} ({rm.source_format}, {rm.quantization}, {rm.parameters / 1e6:.0f}M parameters)")
    except LabError as e:
        print(f"model: NOT READY: {e}")
        return 1
    ok = True
    for r in check_engines(ns.model):
        ok &= r["usable"]
        print(f"  {r['engine']:<13} {'usable' if r['usable'] else 'NOT USABLE'}: {r['detail']}")
    return 0 if ok else 1


# --- prepare ------------------------------------------------------------------------
def cmd_prepare(ns) -> int:
    from .models import prepare

    t0 = time.perf_counter()
    rm = prepare(ns.model)
    dt = time.perf_counter() - t0
    print(f"{rm.name}: {rm.source_format}, {rm.architecture}, {rm.parameters / 1e6:.1f}M parameters, "
          f"{rm.quantization}, sha256 {rm.sha256[:16]}")
    for fmt in ("gguf", "hf", "mlx"):
        print(f"  {fmt:<5} {getattr(rm, f'{fmt}_path') or '-'}")
    how = "nothing to derive" if not rm.derived else f"derived: {rm.derived}" if dt > 2 else "cached"
    print(f"ready in {dt:.2f} s ({how})")
    return 0


# --- run ------------------------------------------------------------------------------
def cmd_run(ns) -> int:
    from .engines import load_engine
    from .engines.base import GenerationConfig
    from .models import prepare
    from .results import run_manifest
    from .workload import chat_ids, prompt_of_length, text_ids

    cfg = GenerationConfig(max_new_tokens=ns.max_new_tokens, ignore_eos=not ns.until_eos,
                           temperature=ns.temperature, top_p=ns.top_p, top_k=ns.top_k, seed=ns.seed)
    rm = prepare(ns.model, log=lambda m: print(m, file=sys.stderr))
    if ns.prompt_tokens is not None:
        ids = prompt_of_length(rm, ns.prompt_tokens)
    elif ns.prompt is not None:
        ids = text_ids(rm, ns.prompt)
    else:
        ids = chat_ids(rm, [{"role": "user", "content": ns.chat or DEFAULT_CHAT}])
    kw = {"n_ctx": ns.n_ctx} if ns.n_ctx is not None else {}
    engine = load_engine(ns.engine, rm, **kw)
    for _ in range(ns.warmup):
        engine.generate(ids, cfg)
    trace = engine.generate(ids, cfg)
    out = trace.metrics()
    out.update(engine=engine.name, text=engine.detokenize(trace.token_ids))
    if ns.json:
        out["token_ids"] = trace.token_ids
        out["manifest"] = run_manifest(engine, {"prompt_tokens": len(ids), "max_new_tokens": cfg.max_new_tokens})
        print(json.dumps(out, default=str))
    else:
        print(f"{engine.name}: {out['prompt_tokens']} prompt tokens -> {out['output_tokens']} output tokens "
              f"({trace.finish_reason})")
        print(f"  TTFT {out['ttft_s'] * 1e3:.1f} ms | prefill {out['prefill_s'] * 1e3:.1f} ms "
              f"({out['prefill_tps']:.0f} tok/s)", end="")
        if out["tpot_s"]:
            print(f" | TPOT {out['tpot_s'] * 1e3:.1f} ms ({out['decode_tps']:.1f} tok/s)", end="")
        print(f" | e2e {out['e2e_s']:.3f} s")
        print(f"  text: {out['text']!r}")
    engine.close()
    return 0


# --- sweep and report ---------------------------------------------------------------------
def cmd_sweep(ns) -> int:
    from . import sweep
    from .results import _suffix

    _suffix(ns.out)  # refuse a bad file name before any work
    common = dict(model=ns.model, engines=ns.engines, max_new_tokens=ns.max_new_tokens, warmup=ns.warmup,
                  out=ns.out, progress=not ns.quiet)
    if ns.kind == "context":
        df = sweep.context_sweep(prompt_tokens=ns.prompt_tokens, reps=ns.reps, **common)
        cols = ["engine", "prompt_tokens", "repetition", "prefill_s", "prefill_tps", "ttft_s", "tpot_s",
                "decode_tps", "e2e_s"]
        table = df[cols] if len(df) else df
    else:
        n_prompt = sweep.positive_ints(ns.prompt_tokens, "prompt_tokens") if ns.prompt_tokens else [None]
        if len(n_prompt) != 1:
            raise LabError(f"--prompt-tokens {ns.prompt_tokens}: a concurrency sweep takes one prompt length")
        df = sweep.concurrency_sweep(concurrency=ns.concurrency, modes=ns.mode, requests=ns.requests,
                                     prompt_tokens=n_prompt[0], **common)
        table = sweep.run_table(df) if len(df) else df
    print(table.to_string(index=False) if len(table) else "no rows")
    print(f"{len(df)} rows appended to {ns.out}")
    return 0


def cmd_report(ns) -> int:
    from .plots import report_html
    from .results import load_results

    from pathlib import Path

    html = Path(ns.html)
    if html.suffix.lower() not in (".html", ".htm"):
        raise LabError(f"--html {ns.html}: expected a file name ending in .html")
    if any(html.resolve() == Path(f).resolve() for f in ns.files):
        raise LabError(f"--html {ns.html} is one of the results files: name a new .html file")
    df = load_results(*ns.files)
    path = report_html(df, ns.html)
    print(f"{len(df)} rows from {len(ns.files)} file(s) -> {path}")
    return 0


def cmd_merge(ns) -> int:
    from .results import merge_results

    df = merge_results(ns.files, ns.out)
    hosts = sorted(df["hostname"].dropna().unique()) if "hostname" in df else []
    print(f"{len(df)} rows from {len(ns.files)} file(s), {len(hosts)} machine(s) {hosts} -> {ns.out}")
    return 0


# --- compare -------------------------------------------------------------------------------
def cmd_compare(ns) -> int:
    from pathlib import Path

    from .compare import compare

    def read_json(path):
        try:
            return json.loads(Path(path).read_text())
        except OSError as e:
            raise LabError(f"{path}: cannot read it ({e.strerror})") from None
        except ValueError as e:
            raise LabError(f"{path}: not valid JSON ({e})") from None

    messages = ids = None
    if ns.messages:
        messages = read_json(ns.messages)
        if isinstance(messages, dict):
            messages = messages.get("messages")
        if not isinstance(messages, list) or not messages:
            raise LabError(f"--messages {ns.messages}: expected a JSON list of {{role, content}} objects "
                           "(or an object with a 'messages' list)")
    if ns.ids:
        data = read_json(ns.ids)
        ids = data.get("prompt_token_ids") if isinstance(data, dict) else data
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids) or not ids:
            raise LabError(f"--ids {ns.ids}: expected a JSON list of token ids (or an object with "
                           "'prompt_token_ids')")
    engine_models = {}
    for spec in ns.engine_model or []:
        name, _, path = spec.partition("=")
        if not path:
            raise LabError(f"--engine-model {spec!r}: expected ENGINE=PATH, e.g. mlx=./my-mlx-folder")
        engine_models[name] = path
    result = compare(ns.model, engines=ns.engines.split(","), reference=ns.reference, prompt=ns.prompt,
                     messages=messages, ids=ids, max_new_tokens=ns.max_new_tokens, engine_models=engine_models)
    if ns.json:
        print(json.dumps(result.to_dict(), default=str))
        return 0
    for c in result.checks:
        mark = {True: "ok  ", False: "DIFF", None: "n/a "}[c.ok]
        print(f"[{mark}] {c.name:<10} {c.verdict}")
    v = result.verdict
    print(f"\nverdict: {v['layer']}" + (f" at position {v['position']}" if v.get("position") is not None else "")
          + (" (near-tie)" if v.get("near_tie") else "") + f"\n  {v['text']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lablib", description="Inference Engine Lab")
    sub = ap.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("doctor", help="is each engine usable here, and why not (exit 0: all usable)")
    d.add_argument("--model", default=None)
    d.set_defaults(func=cmd_doctor)

    p = sub.add_parser("prepare", help="resolve a model and derive its GGUF/HF/MLX formats (cached)")
    p.add_argument("model", nargs="?", default=None, help="GGUF file, HF or MLX folder, hub id (default: SmolLM2-135M)")
    p.set_defaults(func=cmd_prepare)

    r = sub.add_parser("run", help="run one request and print its metrics")
    r.add_argument("--engine", required=True, help="transformers, llama.cpp or mlx")
    r.add_argument("--model", default=None)
    g = r.add_mutually_exclusive_group()
    g.add_argument("--prompt", help="raw text, tokenized as is")
    g.add_argument("--chat", help=f"a user message, rendered with the chat template (default: {DEFAULT_CHAT!r})")
    g.add_argument("--prompt-tokens", type=int, help="exactly N tokens of the lab's prose")
    r.add_argument("--max-new-tokens", type=int, required=True)
    r.add_argument("--until-eos", action="store_true", help="stop at EOS (default: exactly N tokens)")
    r.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    r.add_argument("--top-p", type=float, default=1.0, help="1 = off (default)")
    r.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--n-ctx", type=int, default=None, help="context window (default: the model's trained context)")
    r.add_argument("--warmup", type=int, default=0, help="unrecorded requests first")
    r.add_argument("--json", action="store_true", help="one JSON object")
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("sweep", help="sweep context length or concurrency; rows appended to --out")
    s.add_argument("kind", choices=["context", "concurrency"])
    s.add_argument("--engines", default="transformers,llama.cpp,mlx")
    s.add_argument("--model", default=None)
    s.add_argument("--prompt-tokens", default=None,
                   help="context: lengths such as 64,256,1024 (default log-spaced to the trained context); "
                        "concurrency: one length (default 64)")
    s.add_argument("--max-new-tokens", type=int, default=None)
    s.add_argument("--reps", type=int, default=None, help="context: repetitions per length")
    s.add_argument("--warmup", type=int, default=1)
    s.add_argument("--concurrency", default="1,2,4,8", help="concurrency: client counts")
    s.add_argument("--mode", default="serial,batched", help="concurrency: serial, batched, or serial,batched (default)")
    s.add_argument("--requests", type=int, default=None, help="concurrency: requests per level (default 2 x C)")
    s.add_argument("--out", required=True, help="results file, .jsonl or .parquet (appended)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_sweep)

    rp = sub.add_parser("report", help="write the figures of results files to one self-contained HTML page")
    rp.add_argument("files", nargs="+")
    rp.add_argument("--html", required=True)
    rp.set_defaults(func=cmd_report)

    mg = sub.add_parser("merge", help="combine results files (several machines) into one")
    mg.add_argument("files", nargs="+")
    mg.add_argument("--out", required=True, help=".jsonl or .parquet")
    mg.set_defaults(func=cmd_merge)

    c = sub.add_parser("compare", help="is it the engine or the model? checks in order, one verdict")
    c.add_argument("--model", default=None)
    c.add_argument("--engines", default="transformers,llama.cpp,mlx")
    c.add_argument("--reference", default="transformers", help="the engine the others are held against")
    g = c.add_mutually_exclusive_group()
    g.add_argument("--prompt", help="raw text")
    g.add_argument("--messages", help="JSON file: a list of chat messages")
    g.add_argument("--ids", help="JSON file: a list of prompt token ids")
    c.add_argument("--engine-model", action="append", metavar="ENGINE=PATH",
                   help="another model for one engine, e.g. mlx=./suspicious-mlx-folder")
    c.add_argument("--max-new-tokens", type=int, default=24)
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_compare)
    return ap


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except LabError as e:
        print(f"lablib: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
