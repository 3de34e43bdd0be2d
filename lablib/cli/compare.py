"""`lablib compare ...`: is it the engine or the model? The checks in order, one verdict.

``lablib compare --batches 1,2,4,8``: instead, the same prompt alone and batched beside others
(:func:`lablib.studies.batch_invariance.batch_invariance`, lab 04's worked example 5), on in-process engines
(``--engines``, default llama.cpp) or on a server (``--base-url``)."""

from __future__ import annotations

import json
from pathlib import Path

from lablib.checks import csv_list, positive_ints
from lablib.engines import NAMES
from lablib.errors import LabError
from lablib.studies.compare import REFERENCE, compare

HELP = "is it the engine or the model? checks in order, one verdict"


def add_arguments(p) -> None:
    p.add_argument("--model", default=None)
    p.add_argument(
        "--engines",
        default=None,
        help=f"comma-separated (default: those of {','.join(NAMES)} that can read the model; lablib doctor --model "
        "says which)",
    )
    p.add_argument("--reference", default=REFERENCE, help="the engine the others are held against")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prompt", help="raw text")
    g.add_argument("--messages", help="JSON file: a list of chat messages")
    g.add_argument("--ids", help="JSON file: a list of prompt token ids")
    p.add_argument(
        "--engine-model",
        action="append",
        metavar="ENGINE=PATH",
        help="another model for one engine, e.g. mlx=./suspicious-mlx-folder",
    )
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--json", action="store_true")
    b = p.add_argument_group("another answer under load (instead of the five checks)")
    b.add_argument(
        "--batches",
        default=None,
        help="e.g. 1,2,4,8: each prompt greedy alone twice, then as that many clients the engine batches; where the "
        "ids part and the top-2 margin there. The prompt (--prompt, --messages or --ids) goes first, the lab's eight "
        "questions beside it. Engines: --engines (default llama.cpp) or --base-url",
    )
    b.add_argument("--base-url", default=None, help="with --batches: a server's OpenAI base URL (its own batching)")
    b.add_argument("--server", default="auto", help="with --base-url: the server's kind (default: asked from it)")
    b.add_argument(
        "--margins",
        default=None,
        help="with --batches: the in-process engine whose logits give the top-2 margins (a server gives none; "
        "default: each engine itself)",
    )


def run(ns) -> int:
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
    if ns.batches is None:
        for flag in ("base_url", "margins"):
            if getattr(ns, flag):
                raise LabError(f"--{flag.replace('_', '-')} goes with --batches (another answer under load)")
        if ns.server != "auto":
            raise LabError("--server goes with --batches and --base-url (a server's kind)")
    else:
        return _batches(ns, messages, ids)
    engine_models = {}
    for spec in ns.engine_model or []:
        name, _, path = spec.partition("=")
        if not path:
            raise LabError(f"--engine-model {spec!r}: expected ENGINE=PATH, e.g. mlx=./my-mlx-folder")
        engine_models[name] = path
    result = compare(
        ns.model,
        engines=csv_list(ns.engines, "engines") if ns.engines else None,
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


def _batches(ns, messages, ids) -> int:
    """``--batches``: :func:`batch_invariance` on each engine, the prompt given first and the lab's questions beside."""
    from lablib.engines import load_engine
    from lablib.engines.servers.device import same_kernel
    from lablib.measure.workload import chat_ids, text_ids
    from lablib.model.resolve import prepare
    from lablib.studies.batch_invariance import ENGINE, QUESTIONS, batch_invariance

    levels = positive_ints(ns.batches, "--batches")
    if ns.engine_model:
        raise LabError("--engine-model has no meaning with --batches: it compares one engine with itself")
    if ns.reference != REFERENCE:
        raise LabError("--reference has no meaning with --batches: each engine is held against itself alone")
    if ns.base_url and ns.engines is not None:
        raise LabError("--base-url and --engines: --batches measures either a server or in-process engines")
    if ns.server != "auto" and not ns.base_url:
        raise LabError("--server names the kind of the server at --base-url; give --base-url too")
    if ns.prompt is not None and not ns.prompt.strip():
        raise LabError("--prompt is empty: expected the text of your prompt (or leave it out: the lab's questions)")
    names = [ENGINE] if ns.engines is None else list(dict.fromkeys(csv_list(ns.engines, "engines")))
    rm = prepare(ns.model)
    if ids is not None:
        mine = ids
    elif messages:
        mine = chat_ids(rm, messages)
    else:
        mine = text_ids(rm, ns.prompt) if ns.prompt else None
    prompts = ([mine] if mine is not None else []) + list(QUESTIONS)
    results, server, margins = [], None, None
    try:
        if ns.base_url:
            server = load_engine("http", rm, base_url=ns.base_url, server=ns.server)
        if ns.margins:  # for a server, with its attention kernel where the engine has the choice (llama.cpp's)
            kernel = same_kernel(server.server_settings, ns.margins) if server is not None else {}
            margins = load_engine(ns.margins, rm, **kernel)
        for eng in [server] if server is not None else names:
            results.append(batch_invariance(rm, eng, levels, ns.max_new_tokens, prompts, margins=margins))
    finally:
        for e in (server, margins):
            if e is not None:
                e.close()
    if ns.json:
        out = [
            {
                "engine": r.engine,
                "verdict": r.verdict,
                "repeat_parted": r.repeat_parted,
                "summary": json.loads(r.summary().to_json(orient="records")),
                "table": json.loads(r.table.to_json(orient="records")),
            }
            for r in results
        ]
        print(json.dumps(out))
        return 0
    for r in results:
        print(f"{r.verdict}\n")
        print(r.summary().to_string(index=False))
        parted = r.table[r.table["first_divergence"].notna()]
        if len(parted):
            cols = ["concurrency", "prompt", "first_divergence", "alone_token", "batched_token", "margin", "near_tie"]
            print("\n" + parted[cols].to_string(index=False))
        if mine is not None:
            p0 = r.table[(r.table["prompt"] == 0) & r.table["first_divergence"].notna()]
            print(
                "\nyour prompt (prompt 0): "
                + (
                    "the same ids alone and in every batch"
                    if p0.empty
                    else f"parts in batches of {', '.join(str(c) for c in p0['concurrency'])}"
                )
            )
        print()
    return 0
