"""`lablib compare ...`: is it the engine or the model? The checks in order, one verdict."""

from __future__ import annotations

import json
from pathlib import Path

from lablib.checks import csv_list
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
