"""Lab 10, structured output: a JSON schema or a regular expression enforced by each engine's own grammar, what
it costs (compile time, TTFT, TPOT) and what it buys (the share of outputs that parse and validate).

Each engine enforces a :class:`~lablib.engines.base.Constraint` per request (``GenerationConfig(constraint=)``):
llama.cpp in-process, a GBNF grammar sampler (llama-cpp-python's port of llama.cpp's json_schema_to_grammar.py;
the regex through its raw-pattern mode); llama-server, its ``json_schema`` field (a regex as a GBNF ``grammar``:
llama-server has no regex field); vLLM, ``structured_outputs`` ``{json}`` / ``{regex}`` (its default backend);
transformers, llguidance as a logits processor. An engine without constraints refuses a constrained request.

Why llguidance for transformers (measured here, SmolLM2-135M's tokenizer, the person schema, one 2-core run):
llguidance 1.9.1 compiled the schema in 8.5 ms (1.3 ms the second time; its tokenizer, once per engine, 1.4 s) and
computed a mask in 0.13 ms a step (median); outlines-core 0.2.14 took 2.49 s to build the schema's index and
0.35 ms a step; lm-format-enforcer 0.11.3 does not import with transformers 5 (its integration imports
``transformers.tokenization_utils.PreTrainedTokenizerBase``); xgrammar 0.2.9 pulls triton (pip install --dry-run).
llguidance's own torch helper is ``torch.compile``d (30 s on the first request here): the engine unpacks the mask
with numpy instead.

What each engine cannot compile (data/schemas; a ConstraintError names the engine, the part, its message):
llama.cpp's converter, a lookahead ``pattern`` (password_lookahead) and a ``$ref`` to a URL (remote_ref); llama-server,
the URL ``$ref`` (its C++ converter takes lookaheads without a word); llguidance, the lookahead and ``uniqueItems``
(unique_tags); vLLM, ``uniqueItems`` (xgrammar refuses it, llguidance, its fallback, too: an error event in the
stream). Silent relaxations, seen only in the valid share: vLLM's xgrammar drops the lookahead and the URL ``$ref``
(a warning in the server's log), llama.cpp's grammars have no ``uniqueItems``.

Validity: the output (EOS dropped) parses with ``json.loads`` and validates with ``jsonschema`` (a regex:
``re.fullmatch``). Compile time: where the engine times its own compile (in-process engines:
``engine.constraint_stats``), that; for a server, the first constrained request's TTFT minus the median of the
cached ones (``compile_source`` says which). The first request to a server carries a fresh ``$comment`` in the
schema so a grammar cache (vLLM's) misses.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

from lablib.config import budget, data_dir
from lablib.engines.base import Constraint, GenerationConfig
from lablib.errors import LabError, json_kind

# the shipped schemas (nested objects, arrays, enums, required fields) and two that engines cannot compile
SCHEMA_DIR = data_dir() / "schemas"  # the project's data/schemas ($LABLIB_DATA overrides data/)
# a regex a user would bring: a product code, three capitals, a dash, four digits
REGEX = r"[A-Z]{3}-[0-9]{4}"
REGEX_PROMPT = (
    "Invent a product code: three capital letters, a dash, four digits (like ABC-1234). Reply with the code only."
)


def load_schema(name_or_path) -> Constraint:
    """A JSON-schema Constraint from a file, or from a shipped schema's name (``person``, ``order``, ``weather``,
    ``remote_ref``, ``password_lookahead``, ``unique_tags`` in :data:`SCHEMA_DIR`). Raises LabError for a missing or unreadable file."""
    p = Path(name_or_path)
    if not p.suffix:
        p = SCHEMA_DIR / f"{name_or_path}.json"
    if not p.is_file():
        have = ", ".join(sorted(f.stem for f in SCHEMA_DIR.glob("*.json")))
        raise LabError(f"schema {name_or_path!r}: no file {p}; expected a JSON schema file or one of {have}")
    try:
        schema = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise LabError(f"schema file {p}: not JSON ({e}); expected a JSON schema") from e
    if not isinstance(schema, dict):  # was: AttributeError "'list' object has no attribute 'get'"
        raise LabError(f"schema file {p}: a JSON {json_kind(schema)}; expected a JSON schema, an object ({{...}})")
    return Constraint.json_schema(schema, schema.get("title") or p.stem)


def prompt_messages(constraint: Constraint) -> list[dict]:
    """The chat messages that ask for output matching ``constraint``: the schema itself and its description in the
    question (as a user writes it), or :data:`REGEX_PROMPT`."""
    if constraint.kind == "regex":
        return [{"role": "user", "content": REGEX_PROMPT}]
    spec = {k: v for k, v in constraint.spec.items() if k not in ("title", "description", "$comment")}
    what = constraint.spec.get("description", "")
    return [{"role": "user", "content": f"{what} Reply with JSON only, matching this JSON schema: {json.dumps(spec)}"}]


def check_output(constraint: Constraint, text: str) -> dict:
    """``parses`` (the text is JSON; for a regex: always True) and ``valid`` (it validates against the schema with
    jsonschema, or matches the regex in full)."""
    if constraint.kind == "regex":
        ok = re.fullmatch(constraint.spec, text.strip()) is not None
        return {"parses": True, "valid": ok}
    import jsonschema

    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {"parses": False, "valid": False}
    return {"parses": True, "valid": jsonschema.Draft202012Validator(constraint.spec).is_valid(value)}


def _fresh(constraint: Constraint) -> Constraint:
    """The same constraint under a key no grammar cache holds (a ``$comment``, which no validator reads)."""
    if constraint.kind == "regex":
        return constraint
    return Constraint.json_schema({**constraint.spec, "$comment": f"lab {uuid.uuid4().hex}"}, constraint.name)


def structured_rows(engine, constraints=None, max_new_tokens=None, reps=None, out=None) -> list[dict]:
    """Tidy rows (one per request) for each constraint on a loaded ``engine``: one first constrained request, then
    ``reps`` constrained (cached) and ``reps`` (at least one) free requests of the same prompt (greedy, stopping at EOS, at most
    ``max_new_tokens`` tokens; defaults: :data:`lablib.config.BUDGETS` ``structured``). ``constraints``: Constraints
    or schema names/files (default: the budget's schemas and :data:`REGEX`). ``out``: a results file the rows are
    appended to. Raises ConstraintError (a LabError) when the engine cannot compile one, LabError when it enforces
    no constraints."""
    from lablib.results.store import ResultsWriter, engine_manifest, trace_row

    if constraints is None:
        constraints = [*budget("structured", "schemas"), Constraint.regex(REGEX, "product_code")]
    constraints = [c if isinstance(c, Constraint) else load_schema(c) for c in constraints]
    n_out = int(max_new_tokens or budget("structured", "max_new_tokens"))
    reps = int(budget("structured", "reps") if reps is None else reps)
    manifest = engine_manifest(engine, {"sweep": "structured", "max_new_tokens": n_out, "reps": reps})
    writer = ResultsWriter(out) if out else None
    rows = []
    eos = set(engine.eos_ids)
    from lablib.measure.workload import completion_text, has_chat_template

    chat = has_chat_template(engine.model)  # a base model gets the question as raw text, BOS as it asks
    for c in constraints:
        msgs = prompt_messages(c)
        ids = engine.apply_chat_template(msgs) if chat else engine.tokenize(completion_text(msgs), add_special=True)
        fresh = _fresh(c)  # first and cached requests: one key no cache held before this run
        arms = [("first", fresh)] + [("cached", fresh)] * reps + [("free", None)] * max(1, reps)
        for k, (arm, use) in enumerate(arms):
            engine.constraint_stats = {}
            tr = engine.generate(ids, GenerationConfig(max_new_tokens=n_out, ignore_eos=False, constraint=use))
            stats = dict(engine.constraint_stats)
            text = engine.detokenize([t for t in tr.token_ids if t not in eos])
            row = trace_row(tr, manifest, sweep="structured", mode="single", concurrency=1, repetition=k)
            row.update(constraint_kind=c.kind if use else "none", schema=c.name, constrained=use is not None, arm=arm)
            row.update(check_output(c, text), text=text)
            if use is not None:
                row["compile_s"] = stats.get("compile_s")
                row["compile_cached"] = stats.get("compile_cached")
                row["compile_source"] = "engine" if stats else "ttft_difference"
            rows.append(row)
        _server_compile(rows[-len(arms) :])
        for row in rows[-len(arms) :] if writer is not None else ():
            writer.append(row)  # after the server's compile seconds are known
    return rows


def _server_compile(rows: list[dict]) -> None:
    """A server's compile seconds from its clock: the first request's TTFT minus the median of the cached ones
    (first), the cached median minus the free median (cached; clipped at 0)."""
    import statistics

    if not rows or rows[0].get("compile_source") != "ttft_difference":
        return
    cached = [r["ttft_s"] for r in rows if r["arm"] == "cached"]
    free = [r["ttft_s"] for r in rows if r["arm"] == "free"]
    if not cached:
        return
    med = statistics.median(cached)
    for r in rows:
        if r["arm"] == "first":
            r["compile_s"] = max(0.0, r["ttft_s"] - med)
        elif r["arm"] == "cached" and free:
            r["compile_s"] = max(0.0, med - statistics.median(free))


def structured_table(rows):
    """One row per engine (a server's rows: its ``server``) x schema (:data:`lablib.results.schema.STRUCTURED_TABLE`):
    compile seconds (first, cached:
    medians), TTFT and TPOT medians (seconds) free and constrained, TPOT ratio (constrained / free), valid shares."""
    import pandas as pd

    from lablib.results.tables import need

    df = pd.DataFrame(rows) if not isinstance(rows, pd.DataFrame) else rows.copy()
    need(df, ("engine", "schema", "arm", "constrained", "ttft_s", "tpot_s", "valid"), "structured_table")
    if "server" in df:  # a server's rows (the http engine) are labelled by the server they ran on
        df["engine"] = df["server"].where(df["server"].notna(), df["engine"])
    out = []
    for (engine, schema), g in df.groupby(["engine", "schema"], sort=False):
        con, free = g[g["constrained"].astype(bool)], g[~g["constrained"].astype(bool)]
        first, cached = con[con["arm"] == "first"], con[con["arm"] == "cached"]
        r = {
            "engine": engine,
            "schema": schema,
            "constraint_kind": con["constraint_kind"].iloc[0] if len(con) else None,
            "compile_source": con["compile_source"].iloc[0] if len(con) else None,
            "compile_first_s": first["compile_s"].median() if len(first) else float("nan"),
            "compile_cached_s": cached["compile_s"].median() if len(cached) else float("nan"),
            "ttft_free_s": free["ttft_s"].median(),
            "ttft_constrained_s": con["ttft_s"].median(),
            "tpot_free_s": free["tpot_s"].median(),
            "tpot_constrained_s": con["tpot_s"].median(),
            "valid_free": free["valid"].astype(float).mean(),
            "valid_constrained": con["valid"].astype(float).mean(),
            "requests": len(g),
        }
        r["tpot_ratio"] = r["tpot_constrained_s"] / r["tpot_free_s"]
        out.append(r)
    return pd.DataFrame(out)


def run_engine(name: str, constraints=None, max_new_tokens=None, reps=None, model=None, out=None) -> list[dict]:
    """:func:`structured_rows` on engine ``name``: an in-process engine loaded for the run (a name of
    :data:`lablib.engines.IN_PROCESS`, aliases too), else a server the lab starts for it (a name of
    :data:`lablib.engines.servers.SERVERS`: llama-server, vllm), stopped afterwards."""
    from lablib.engines import IN_PROCESS, canonical, load_engine
    from lablib.engines.servers import SERVERS, start_server
    from lablib.model.resolve import prepare

    m = prepare(model) if model else prepare()
    try:
        in_process = canonical(name) in IN_PROCESS
    except LabError:
        in_process = False
    if not in_process and name in SERVERS:
        with start_server(name, m, parallel=1, n_ctx=1024) as srv, srv.engine(m) as engine:
            return structured_rows(engine, constraints, max_new_tokens, reps, out)
    with load_engine(name, m, n_ctx=1024) as engine:
        return structured_rows(engine, constraints, max_new_tokens, reps, out)
