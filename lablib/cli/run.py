"""`lablib run --engine NAME ...`: one request, its metrics printed (or one JSON object)."""

from __future__ import annotations

import json
import sys

from lablib.checks import whole
from lablib.engines import IN_PROCESS, check_load_args, check_supported, engine_class, load_engine
from lablib.engines.base import GenerationConfig
from lablib.machine.threads import default_threads
from lablib.measure.plan import check_warmup
from lablib.measure.sweep import measured_traces
from lablib.measure.workload import DEFAULT_MESSAGES, chat_ids, prompt_of_length, question_ids, text_ids
from lablib.model.resolve import prepare
from lablib.results.store import engine_manifest

DEFAULT_CHAT = DEFAULT_MESSAGES[-1]["content"]
HELP = "run one request and print its metrics"


def add_arguments(p) -> None:
    p.add_argument("--engine", required=True, help=", ".join(IN_PROCESS))
    p.add_argument("--model", default=None)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prompt", help="raw text, tokenized as is")
    g.add_argument(
        "--chat",
        help=f"a user message, rendered with the chat template (default: {DEFAULT_CHAT!r}; a base model, which has "
        "none, gets the default question as raw text)",
    )
    g.add_argument("--prompt-tokens", type=int, help="exactly N tokens of the lab's prose")
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--until-eos", action="store_true", help="stop at EOS (default: exactly N tokens)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-ctx", type=int, default=None, help="context window (default: the model's trained context)")
    p.add_argument("--warmup", type=int, default=0, help="unrecorded requests first")
    p.add_argument("--json", action="store_true", help="one JSON object")


def run(ns) -> int:
    cfg = GenerationConfig(
        max_new_tokens=ns.max_new_tokens,
        ignore_eos=not ns.until_eos,
        temperature=ns.temperature,
        top_p=ns.top_p,
        top_k=ns.top_k,
        seed=ns.seed,
    )
    cls = engine_class(ns.engine)
    # the flags and LABLIB_THREADS checked before the model's tokenizer and weights load (seconds)
    cls.check_generation(cfg)
    check_load_args({"n_ctx": ns.n_ctx})
    check_warmup(ns.warmup)  # -1 ran as 0 without a word
    if ns.prompt_tokens is not None:  # said as the flag (prompt_of_length's own check names its keyword, n)
        whole(ns.prompt_tokens, "prompt_tokens", "a prompt length in tokens, a whole number of at least 1")
    if cls.in_process:
        default_threads()
    rm = prepare(ns.model, log=lambda m: print(m, file=sys.stderr))
    check_supported(cls.name, rm)  # a model this engine cannot read: said before the tokenizer loads
    if ns.prompt_tokens is not None:
        ids, prompt_format = prompt_of_length(rm, ns.prompt_tokens), "tokens"
    elif ns.prompt is not None:
        ids, prompt_format = text_ids(rm, ns.prompt), "text"
    elif ns.chat is not None:
        ids, prompt_format = chat_ids(rm, [{"role": "user", "content": ns.chat}]), "chat"
    else:
        ids, prompt_format = question_ids(rm, log=lambda m: print(m, file=sys.stderr))
    kw = {"n_ctx": ns.n_ctx} if ns.n_ctx is not None else {}
    engine = load_engine(ns.engine, rm, **kw)
    try:
        _run_and_print(engine, ids, cfg, ns, prompt_format)
    finally:
        engine.close()
    return 0


def _run_and_print(engine, ids, cfg, ns, prompt_format: str) -> None:
    (trace,) = measured_traces(engine, [ids], cfg, warmup=[ids] * ns.warmup)
    out = trace.metrics()
    out.update(engine=engine.name, prompt_format=prompt_format, text=engine.detokenize(trace.token_ids))
    if ns.json:
        out["token_ids"] = trace.token_ids
        out["manifest"] = engine_manifest(engine, {"prompt_tokens": len(ids), "max_new_tokens": cfg.max_new_tokens})
        print(json.dumps(out, default=str))
    else:
        print(
            f"{engine.name}: {out['prompt_tokens']} prompt tokens ({prompt_format}) -> {out['output_tokens']} output "
            f"tokens ({trace.finish_reason})"
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
