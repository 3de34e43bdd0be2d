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
    lablib serve --server NAME [--port P] [--parallel N]      a real server on the lab's model
    lablib bench --base-url URL [--model ID] [--rate R | --concurrency C] --requests N
               --prompt-tokens P --max-new-tokens M --out FILE   load on any OpenAI-compatible server
    lablib roofline [--results FILE...] [--engines a,b,c] [--refresh] [--json]
    lablib quantize [--types Q8_0,Q4_K_M,...] [--model M] [--out FILE]   the quantization ladder, measured
    lablib quality --engine E [--model M] [--variant V] --out FILE       one engine vs the F32 reference
    lablib prefix [--engines a,b,c] [--shared-tokens 64,256] [--turns N] [--json]   prefix caching (lab 08)

Errors the user can act on (LabError) print one message and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lablib.measure import sweep
from lablib._version import __version__
from lablib.studies.compare import REFERENCE, compare
from lablib.measure.closed_loop import MODES
from lablib.config import budget
from lablib.machine.threads import default_threads
from lablib.machine.identity import describe as describe_devices, found as found_devices
from lablib.engines.doctor import check_engines
from lablib.engines import IN_PROCESS, NAMES, engine_class, load_engine
from lablib.engines.base import GenerationConfig
from lablib.errors import LabError
from lablib.model.formats import FORMATS
from lablib.machine.limits import available_ram_bytes
from lablib.machine.threads import cpus_busy
from lablib.machine.identity import hardware_info, load_average
from lablib.model.resolve import prepare
from lablib.ui.report import report_html
from lablib.results.store import _suffix, load_results, merge_results
from lablib.results.schema import METRICS
from lablib.results.tables import run_table
from lablib.measure.workload import DEFAULT_MESSAGES, chat_ids, prompt_of_length, text_ids

DEFAULT_CHAT = DEFAULT_MESSAGES[-1]["content"]
BUSY_CPUS = 0.3  # doctor warns when other processes keep at least this many CPUs busy


# --- doctor -------------------------------------------------------------------------
def cmd_doctor(ns) -> int:
    hw = hardware_info()
    print(f"lablib {__version__}, Python {hw['python']}, {hw['os']} {hw['machine']}")
    print(
        f"CPU: {hw['cpu_model']}, {hw['cores_physical']} cores, RAM {hw['ram_bytes'] / 2**30:.1f} GiB, "
        f"accelerator: {hw['accelerator'] or 'none'}"
    )
    print(f"devices the engines can compute on: {describe_devices(found_devices())}")
    if hw["cpu_quota"] or hw["memory_limit_bytes"]:
        limit = hw["memory_limit_bytes"]
        print(
            f"container caps: CPU {hw['cpu_quota'] or 'no cap'}"
            f"{' CPUs' if hw['cpu_quota'] else ''}, memory "
            f"{f'{limit / 2**30:.1f} GiB' if limit else 'no cap'}"
        )
    print(f"engines will use {default_threads()} threads; {available_ram_bytes() / 2**30:.1f} GiB free for them")
    busy = cpus_busy()
    if busy >= BUSY_CPUS:
        print(
            f"WARNING: the machine is busy: other processes keep {busy:.1f} of {hw['cores_logical']} CPUs busy "
            f"(load average {load_average()}). Timings will be slower and noisier than on a quiet machine; "
            "close what runs (a browser tab, a build) or measure with fewer threads (LABLIB_THREADS=1)"
        )
    try:
        rm = prepare(ns.model, log=lambda *_: None)
        print(f"model: {rm.name} ({rm.source_format}, {rm.quantization}, {rm.parameters / 1e6:.0f}M parameters)")
    except LabError as e:
        print(f"model: NOT READY: {e}")
        return 1
    ok = True
    checks = check_engines(ns.model)
    width = max((len(r["engine"]) for r in checks), default=13)
    for r in checks:
        # an optional engine (outside the default set) whose package is not installed is not a fault
        optional_absent = r["engine"] not in NAMES and r["detail"].startswith("not installed")
        ok &= r["usable"] or optional_absent
        state = "usable" if r["usable"] else "not installed (optional)" if optional_absent else "NOT USABLE"
        print(f"  {r['engine']:<{width}} {state}: {r['detail']}")
    return 0 if ok else 1


# --- prepare ------------------------------------------------------------------------
def cmd_prepare(ns) -> int:
    t0 = time.perf_counter()
    rm = prepare(ns.model)
    dt = time.perf_counter() - t0
    print(
        f"{rm.name}: {rm.source_format}, {rm.architecture}, {rm.parameters / 1e6:.1f}M parameters, "
        f"{rm.quantization}, sha256 {rm.sha256[:16]}"
    )
    for fmt in FORMATS:
        print(f"  {fmt:<5} {getattr(rm, f'{fmt}_path') or '-'}")
    how = "nothing to derive" if not rm.derived else f"derived: {rm.derived}" if dt > 2 else "cached"
    print(f"ready in {dt:.2f} s ({how})")
    return 0


# --- run ------------------------------------------------------------------------------
def cmd_run(ns) -> int:
    cfg = GenerationConfig(
        max_new_tokens=ns.max_new_tokens,
        ignore_eos=not ns.until_eos,
        temperature=ns.temperature,
        top_p=ns.top_p,
        top_k=ns.top_k,
        seed=ns.seed,
    )
    engine_class(ns.engine).check_generation(cfg)  # before preparing and loading anything
    rm = prepare(ns.model, log=lambda m: print(m, file=sys.stderr))
    if ns.prompt_tokens is not None:
        ids = prompt_of_length(rm, ns.prompt_tokens)
    elif ns.prompt is not None:
        ids = text_ids(rm, ns.prompt)
    else:
        ids = chat_ids(rm, [{"role": "user", "content": ns.chat or DEFAULT_CHAT}])
    kw = {"n_ctx": ns.n_ctx} if ns.n_ctx is not None else {}
    engine = load_engine(ns.engine, rm, **kw)
    try:
        _run_and_print(engine, ids, cfg, ns)
    finally:
        engine.close()
    return 0


def _run_and_print(engine, ids, cfg, ns) -> None:
    for _ in range(ns.warmup):
        engine.generate(ids, cfg)
    trace = engine.generate(ids, cfg)
    out = trace.metrics()
    out.update(engine=engine.name, text=engine.detokenize(trace.token_ids))
    if ns.json:
        out["token_ids"] = trace.token_ids
        out["manifest"] = sweep.engine_manifest(
            engine, {"prompt_tokens": len(ids), "max_new_tokens": cfg.max_new_tokens}
        )
        print(json.dumps(out, default=str))
    else:
        print(
            f"{engine.name}: {out['prompt_tokens']} prompt tokens -> {out['output_tokens']} output tokens "
            f"({trace.finish_reason})"
        )
        print(
            f"  TTFT {out['ttft_s'] * 1e3:.1f} ms | prefill {out['prefill_s'] * 1e3:.1f} ms "
            f"({out['prefill_tps']:.0f} tok/s)",
            end="",
        )
        if out["tpot_s"]:
            print(f" | TPOT {out['tpot_s'] * 1e3:.1f} ms ({out['decode_tps']:.1f} tok/s)", end="")
        print(f" | e2e {out['e2e_s']:.3f} s")
        print(f"  text: {out['text']!r}")


# --- sweep and report ---------------------------------------------------------------------
def cmd_sweep(ns) -> int:
    _suffix(ns.out)  # refuse a bad file name before any work
    common = dict(
        model=ns.model,
        engines=ns.engines,
        max_new_tokens=ns.max_new_tokens,
        warmup=ns.warmup,
        out=ns.out,
        progress=not ns.quiet,
        weights=ns.weights,
    )
    if ns.kind == "context":
        df = sweep.context_sweep(prompt_tokens=ns.prompt_tokens, reps=ns.reps, **common)
        cols = ["engine", "prompt_tokens", "repetition", *(m for m in METRICS if m != "queue_s")]
        table = df[cols] if len(df) else df
    else:
        n_prompt = sweep.positive_ints(ns.prompt_tokens, "prompt_tokens") if ns.prompt_tokens else [None]
        if len(n_prompt) != 1:
            raise LabError(f"--prompt-tokens {ns.prompt_tokens}: a concurrency sweep takes one prompt length")
        df = sweep.concurrency_sweep(
            concurrency=ns.concurrency, modes=ns.mode, requests=ns.requests, prompt_tokens=n_prompt[0], **common
        )
        table = run_table(df) if len(df) else df
    print(table.to_string(index=False) if len(table) else "no rows")
    print(f"{len(df)} rows appended to {ns.out}")
    return 0


def cmd_report(ns) -> int:
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
    df = merge_results(ns.files, ns.out)
    hosts = sorted(df["hostname"].dropna().unique()) if "hostname" in df else []
    print(f"{len(df)} rows from {len(ns.files)} file(s), {len(hosts)} machine(s) {hosts} -> {ns.out}")
    return 0


# --- compare -------------------------------------------------------------------------------
def cmd_compare(ns) -> int:
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
            raise LabError(
                f"--messages {ns.messages}: expected a JSON list of {{role, content}} objects "
                "(or an object with a 'messages' list)"
            )
    if ns.ids:
        data = read_json(ns.ids)
        ids = data.get("prompt_token_ids") if isinstance(data, dict) else data
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids) or not ids:
            raise LabError(f"--ids {ns.ids}: expected a JSON list of token ids (or an object with 'prompt_token_ids')")
    engine_models = {}
    for spec in ns.engine_model or []:
        name, _, path = spec.partition("=")
        if not path:
            raise LabError(f"--engine-model {spec!r}: expected ENGINE=PATH, e.g. mlx=./my-mlx-folder")
        engine_models[name] = path
    result = compare(
        ns.model,
        engines=ns.engines.split(","),
        reference=ns.reference,
        prompt=ns.prompt,
        messages=messages,
        ids=ids,
        max_new_tokens=ns.max_new_tokens,
        engine_models=engine_models,
    )
    if ns.json:
        print(json.dumps(result.to_dict(), default=str))
        return 0
    for c in result.checks:
        mark = {True: "ok  ", False: "DIFF", None: "n/a "}[c.ok]
        print(f"[{mark}] {c.name:<10} {c.verdict}")
    v = result.verdict
    print(
        f"\nverdict: {v['layer']}"
        + (f" at position {v['position']}" if v.get("position") is not None else "")
        + (" (near-tie)" if v.get("near_tie") else "")
        + f"\n  {v['text']}"
    )
    return 0


# --- serving (lablib.cli.serve) ------------------------------------------------------------
def cmd_serve(ns) -> int:
    from lablib.cli.serve import serve

    return serve(ns)


def cmd_bench(ns) -> int:
    from lablib.cli.serve import bench

    return bench(ns)


def _csv(values) -> str:
    return ",".join(str(v) for v in values)


def _quick_full(kind: str, setting: str) -> str:
    """A default of lablib.config.BUDGETS as help text: "FULL (QUICK in quick mode)"."""
    full, quick = (budget(kind, setting, q) for q in (False, True))
    full, quick = (_csv(v) if isinstance(v, tuple) else str(v) for v in (full, quick))
    return full if full == quick else f"{full} ({quick} in quick mode)"


# --- roofline ------------------------------------------------------------------------------
def cmd_roofline(ns) -> int:
    from lablib.cli.roofline import roofline_report

    out = roofline_report(results=ns.results, engines=ns.engines, model=ns.model, refresh=ns.refresh)
    if ns.json:
        print(json.dumps(out, default=str))
        return 0
    m = out["machine"]
    rates = ", ".join(f"{k} {v:.0f} G/s" for k, v in m["gflops"].items())
    print(
        f"{m['cpu_model']}, {m['threads']} threads: bandwidth {m['bandwidth_gbps']:.1f} GB/s (read; STREAM copy "
        f"{m['copy_gbps']:.1f}, triad {m['triad_gbps']:.1f}), matmul {rates}"
    )
    for e, r in out["engines"].items():
        print(
            f"  {e:<13} decode {r['decode_tps']:.1f} tok/s of a {r['decode_bound_tps']:.1f} tok/s bound "
            f"({100 * r['fraction_of_bound']:.0f} %), prompt {r['prompt_tokens']} tokens; {r['source']}"
        )
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
    r.add_argument("--engine", required=True, help=", ".join(IN_PROCESS))
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
    s.add_argument("--engines", default=",".join(NAMES))
    s.add_argument("--model", default=None)
    s.add_argument(
        "--prompt-tokens",
        default=None,
        help="context: lengths such as 64,256,1024, default log-spaced to the trained context "
        f"({_csv(budget('context', 'prompt_tokens', True))} in quick mode); concurrency: one length, "
        f"default {_quick_full('concurrency', 'prompt_tokens')}",
    )
    s.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"output tokens per request; default: context {_quick_full('context', 'max_new_tokens')}, "
        f"concurrency {_quick_full('concurrency', 'max_new_tokens')}",
    )
    s.add_argument(
        "--reps",
        type=int,
        default=None,
        help=f"context: repetitions per length, default {_quick_full('context', 'reps')}",
    )
    s.add_argument("--warmup", type=int, default=1)
    s.add_argument(
        "--concurrency",
        default=None,
        help=f"concurrency: client counts, default {_quick_full('concurrency', 'concurrency')}",
    )
    s.add_argument("--mode", default=",".join(MODES), help="concurrency: serial, batched, or serial,batched (default)")
    s.add_argument(
        "--requests",
        type=int,
        default=None,
        help=f"concurrency: requests per level (default {budget('concurrency', 'requests_per_client')} x C)",
    )
    s.add_argument(
        "--weights",
        default=None,
        help="weight choices per engine, e.g. openvino=source,onnxruntime-genai=int4 (default: each engine's own)",
    )
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
    c.add_argument("--engines", default=",".join(NAMES))
    c.add_argument("--reference", default=REFERENCE, help="the engine the others are held against")
    g = c.add_mutually_exclusive_group()
    g.add_argument("--prompt", help="raw text")
    g.add_argument("--messages", help="JSON file: a list of chat messages")
    g.add_argument("--ids", help="JSON file: a list of prompt token ids")
    c.add_argument(
        "--engine-model",
        action="append",
        metavar="ENGINE=PATH",
        help="another model for one engine, e.g. mlx=./suspicious-mlx-folder",
    )
    c.add_argument("--max-new-tokens", type=int, default=24)
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_compare)

    from lablib.cli.serve import add_parsers

    add_parsers(sub, cmd_serve, cmd_bench)

    rf = sub.add_parser("roofline", help="this machine's bandwidth and FLOP/s, each engine's decode against its bound")
    rf.add_argument(
        "--results",
        nargs="*",
        default=None,
        help="results files (default: results/ and labs/results/ here; none: a quick measurement)",
    )
    rf.add_argument("--engines", default="transformers,llama.cpp,mlx")
    rf.add_argument("--model", default=None)
    rf.add_argument("--refresh", action="store_true", help="measure the machine again (else the cached measurement)")
    rf.add_argument("--json", action="store_true", help="one JSON object")
    rf.set_defaults(func=cmd_roofline)

    from lablib.cli.quantize import add_parsers as add_quant_parsers

    add_quant_parsers(sub)

    from lablib.cli.prefix import add_parsers as add_prefix_parsers

    add_prefix_parsers(sub)
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
