"""Is it the engine or the model? Every place two engines can disagree, checked in order.

1. config     the model's settings as each engine *uses* them (RoPE base read back
              from the loaded rotary embedding, not only from a file)
2. tokenizer  the same text through each engine's tokenizer
3. template   the same messages through each engine's chat template
4. logits     the same ids teacher-forced: top-k, argmax agreement, KL, max |dlogp|
5. generation greedy continuations side by side, first divergence

Each check returns a :class:`Check` (a pandas DataFrame plus a one-line
verdict); :func:`compare` runs them in order and names the first layer that
disagrees: ``config``, ``tokenizer``, ``template``, ``numerics`` (with
``near_tie`` when the reference's top-2 margin at the divergence is below
:data:`NEAR_TIE_NATS`) or ``none``. The reference defaults to transformers in
float32: slow, but the faithful arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from lablib.checks import chat_messages
from lablib.engines import canonical, check_supported, engine_class, load_engine
from lablib.engines.base import CONFIG_KEYS, Engine, GenerationConfig
from lablib.engines.memory import check_compare_fits
from lablib.errors import LabError, shown
from lablib.measure.plan import engine_names
from lablib.measure.workload import DEFAULT_MESSAGES, completion_text, has_chat_template
from lablib.model.formats import config_settings, gguf_config, read_config
from lablib.model.resolve import resolve
from lablib.studies.logits import LOGIT_CHUNK, TOP_K, last_logits, log_softmax, logit_blocks, logit_stats

NEAR_TIE_NATS = 0.5  # top-2 log-prob margin below which a flip is a near-tie (p1/p2 < e^0.5 = 1.65)
KL_OK = 0.05  # nats; mean KL above this is numerics beyond rounding (first_token_flip: 0.0069)
REFERENCE = "transformers"  # the default reference: float32, slow, but the faithful arithmetic
LAYERS = ("config", "tokenizer", "template", "numerics", "none")


@dataclass
class Check:
    """One check's outcome. ``ok``: True agree, False disagree, None could not run."""

    name: str
    ok: bool | None
    verdict: str
    table: object = None  # pandas DataFrame
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        table = None
        if self.table is not None:
            table = self.table.astype(object).where(self.table.notna(), None).to_dict("records")
        return {
            "name": self.name,
            "ok": self.ok,
            "verdict": self.verdict,
            "table": table,
            "details": _plain(self.details),
        }


def _plain(x):
    import numpy as np

    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return x


def _int_cols(df, *cols):
    """Positions stay integers (pandas' nullable Int64: <NA> where there is none)."""
    for c in cols:
        if c in df:
            df[c] = df[c].astype("Int64")
    return df


# --- 1. config ------------------------------------------------------------------------------
# each engine reads back its own settings: Engine.effective_config() in lablib/engines/


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-3)
        except (TypeError, ValueError):
            return a == b
    return a == b


def check_config(engines: dict, reference: str, gguf_path=None, config_folder=None) -> Check:
    """Settings per engine (columns) against the reference engine, and as the model's files state them: the
    GGUF header (as llama.cpp reads it) and the Hugging Face folder's config.json (as transformers reads it),
    RoPE bases per kind of layer and the sliding window included (:data:`lablib.model.formats.SETTINGS_KEYS`)."""
    import pandas as pd

    cols = {}
    if gguf_path:
        cols["gguf file"] = gguf_config(gguf_path)
    if config_folder:
        cols["config.json"] = config_settings(read_config(config_folder))
    for name, e in engines.items():
        cols[name] = e.effective_config()
    ref = cols[reference]
    rows, bad = [], []
    for key in CONFIG_KEYS:
        row = {"setting": key, **{c: v[key] for c, v in cols.items()}}
        mism = [c for c, v in cols.items() if not _same(v[key], ref[key])]
        row["mismatch"] = ", ".join(mism)
        if mism:
            bad.append(f"{key}: " + ", ".join(f"{c} {cols[c][key]}" for c in mism) + f" vs {reference} {ref[key]}")
        rows.append(row)
    verdict = "config agrees" if not bad else "config differs: " + "; ".join(bad)
    return Check("config", not bad, verdict, pd.DataFrame(rows), {"mismatches": bad})


# --- 2. tokenizer -------------------------------------------------------------------------------
def first_difference(a: list, b: list) -> int | None:
    """First index where two id lists differ (or the shorter length), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _pieces(engine, ids, at: int, width: int = 3) -> list[str]:
    return [engine.detokenize([t]) for t in ids[at : at + width]]


def check_tokenizer(engines: dict, reference: str, text: str) -> Check:
    """The same text through each engine's tokenizer: identical ids, or the first
    differing position with the pieces on each side."""
    import pandas as pd

    ref_ids = engines[reference].tokenize(text)
    rows, bad = [], []
    for name, e in engines.items():
        ids = e.tokenize(text)
        pos = first_difference(ref_ids, ids)
        row = {
            "engine": name,
            "n_tokens": len(ids),
            "first_difference": pos,
            "ids_there": ids[pos : pos + 3] if pos is not None else None,
            "pieces_there": _pieces(e, ids, pos) if pos is not None else None,
            "reference_ids_there": ref_ids[pos : pos + 3] if pos is not None else None,
            "reference_pieces_there": _pieces(engines[reference], ref_ids, pos) if pos is not None else None,
        }
        rows.append(row)
        if pos is not None:
            bad.append(
                f"{name} differs from {reference} at token {pos}: {row['pieces_there']} "
                f"{row['ids_there']} vs {row['reference_pieces_there']} {row['reference_ids_there']}"
            )
    verdict = "tokenizers agree" if not bad else "; ".join(bad)
    return Check("tokenizer", not bad, verdict, _int_cols(pd.DataFrame(rows), "first_difference"), {"differences": bad})


# --- 3. chat template ---------------------------------------------------------------------------
TEMPLATE_CASES = {
    "one turn": DEFAULT_MESSAGES,
    "one turn + system": [{"role": "system", "content": "You answer in one word."}, *DEFAULT_MESSAGES],
    "two turns": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello. How can I help?"},
        {"role": "user", "content": "Name a river."},
    ],
    "two turns + system": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Name a river."},
    ],
}


def check_template(engines: dict, reference: str, cases: dict | None = None) -> Check:
    """Each case's messages rendered by each engine's own chat path, compared as ids
    (and as strings), with the number of BOS tokens in each. A model with no chat template in any engine
    (a base model) is not checked (ok None, said); one that some engines can render and others cannot is a
    difference."""
    import pandas as pd

    rows, bad = [], []
    for case, messages in (cases or TEMPLATE_CASES).items():
        rendered, failed = {}, {}
        for name, e in engines.items():
            try:
                rendered[name] = e.apply_chat_template(messages)
            except Exception as ex:  # an engine without a template for this model: its library's own error
                failed[name] = f"{type(ex).__name__}: {str(ex).splitlines()[0] if str(ex) else ''}"
        if not rendered:
            return Check(
                "template",
                None,
                "no engine has a chat template for this model (a base model): templates not checked",
                pd.DataFrame([{"engine": n, "error": m} for n, m in failed.items()]),
                {"differences": []},
            )
        for name, msg in failed.items():
            rows.append({"case": case, "engine": name, "error": msg})
            bad.append(f"{name} cannot render '{case}' ({msg}) where {', '.join(rendered)} can")
        if reference not in rendered:
            continue
        ref_ids = rendered[reference]
        bos = engines[reference].bos_id
        for name, ids in rendered.items():
            pos = first_difference(ref_ids, ids)
            rows.append(
                {
                    "case": case,
                    "engine": name,
                    "n_tokens": len(ids),
                    "bos_count": ids.count(bos),
                    "first_difference": pos,
                    "text": engines[name].detokenize(ids),
                    "pieces_there": _pieces(engines[name], ids, pos) if pos is not None else None,
                }
            )
            if pos is not None:
                bad.append(
                    f"'{case}': {name} differs from {reference} at token {pos} "
                    f"({_pieces(engines[name], ids, pos)} vs {_pieces(engines[reference], ref_ids, pos)})"
                )
    verdict = "chat templates agree" if not bad else "; ".join(bad)
    return Check(
        "template",
        not bad,
        verdict,
        _int_cols(pd.DataFrame(rows), "first_difference", "bos_count"),
        {"differences": bad},
    )


# --- 4. logits ------------------------------------------------------------------------------------
# the logit math (log_softmax, logit_stats, logit_blocks, last_logits) is lablib.studies.logits


def check_logits(engines: dict, reference: str, ids: list[int], k: int = TOP_K, chunk: int = LOGIT_CHUNK) -> Check:
    """The same ids teacher-forced through each engine; positions are prompt positions
    (position i predicts token i + 1; the last predicts the first generated token).

    Streams: every engine advances ``chunk`` positions at a time in lockstep and only the
    per-position statistics are kept (:func:`logit_stats`), so memory grows with
    chunk x vocabulary, not positions x vocabulary."""
    import numpy as np
    import pandas as pd

    ref_blocks = logit_blocks(engines[reference], ids, chunk)
    ref_block = next(ref_blocks)
    rows, stats, bad, unavailable = [], {}, [], []
    streams, blocks, parts = {}, {}, {}
    for name, e in engines.items():
        if name == reference:
            continue
        try:
            streams[name] = logit_blocks(e, ids, chunk)
            blocks[name] = next(streams[name])
        except NotImplementedError as ex:
            unavailable.append(f"{name}: logits not available ({ex})")
            streams.pop(name, None)
            continue
        parts[name] = []
    while True:
        for name in streams:
            if blocks[name].shape != ref_block.shape:
                raise LabError(
                    f"{name} gave logits of shape {blocks[name].shape} where {reference} gave "
                    f"{ref_block.shape}: expected the same vocabulary and positions"
                )
            parts[name].append(logit_stats(ref_block, blocks[name], k))
        ref_block = next(ref_blocks, None)
        if ref_block is None:
            break
        for name in streams:
            blocks[name] = next(streams[name])
    for g in streams.values():
        g.close()  # llama.cpp clears its KV cache when its stream ends
    for name in streams:
        s = {key: np.concatenate([p[key] for p in parts[name]]) for key in parts[name][0]}
        stats[name] = s
        agree = s["argmax"] == s["argmax_ref"]
        first = int((~agree).argmax()) if (~agree).any() else None
        rows.append(
            {
                "engine": name,
                "positions": len(ids),
                "argmax_agreement": float(agree.mean()),
                "mean_kl": float(s["kl"].mean()),
                "kl_last": float(s["kl"][-1]),
                "max_abs_dlogp": float(s["max_abs_dlogp"].max()),
                "first_argmax_difference": first,
                "margin_ref_there": float(s["margin_ref"][first]) if first is not None else None,
                "top5_ref_last": s["topk_ref"][-1].tolist(),
                "top5_last": s["topk"][-1].tolist(),
            }
        )
        if float(s["kl"].mean()) > KL_OK:
            bad.append(f"{name}: mean KL {float(s['kl'].mean()):.3f} nats > {KL_OK}")
    if unavailable and not rows:
        return Check("logits", None, "; ".join(unavailable), pd.DataFrame(rows), {"unavailable": unavailable})
    parts = [
        f"{r['engine']}: argmax agrees at {r['argmax_agreement']:.0%} of {r['positions']} positions, "
        f"mean KL {r['mean_kl']:.4f}, max |dlogp| {r['max_abs_dlogp']:.2f}"
        for r in rows
    ] + unavailable
    return Check(
        "logits",
        not bad,
        "; ".join(parts),
        _int_cols(pd.DataFrame(rows), "first_argmax_difference"),
        {"stats": stats, "unavailable": unavailable},
    )


# --- 5. generation --------------------------------------------------------------------------------
def topk_next(engine, ids: list[int], k: int) -> dict | None:
    """``engine``'s top-k next tokens after ``ids``: {"ids", "logp" (nats), "pieces"}; None when
    the engine exposes no logits."""
    import numpy as np

    try:
        lp = log_softmax(last_logits(engine, ids))  # streamed: never [positions, vocab]
    except NotImplementedError:
        return None
    top = np.argsort(-lp)[:k]
    return {
        "ids": [int(t) for t in top],
        "logp": [float(lp[t]) for t in top],
        "pieces": [engine.detokenize([int(t)]) for t in top],
    }


def check_generation(engines: dict, reference: str, ids: list[int], max_new_tokens: int = 24, k: int = TOP_K) -> Check:
    """Greedy continuations side by side; the first generated position where each differs
    from the reference, and the reference's top-2 margin there.

    ``details["topk"][engine]``: at that engine's divergence, the top-``k`` next tokens of the
    reference and of the engine ({"position", reference name: {"ids", "logp", "pieces"},
    engine name: {...}}), what :func:`lablib.plots.topk_at_divergence` draws.
    """
    import pandas as pd

    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    outs = {name: e.generate(ids, cfg).token_ids for name, e in engines.items()}
    ref_out = outs[reference]
    rows, bad, topk = [], [], {}
    for name, out in outs.items():
        pos = first_difference(ref_out, out)
        row = {"engine": name, "text": engines[name].detokenize(out), "first_divergence": pos, "ids": out}
        if pos is not None:
            context = list(ids) + list(ref_out[:pos])
            ref_top = topk_next(engines[reference], context, max(k, 2))
            lp = ref_top["logp"]
            row.update(
                reference_top2=ref_top["ids"][:2],
                margin_ref=float(lp[0] - lp[1]),
                reference_token=engines[reference].detokenize([ref_out[pos]]),
                engine_token=engines[name].detokenize([out[pos]]),
            )
            topk[name] = {
                "position": pos,
                reference: {key: v[:k] for key, v in ref_top.items()},
                name: topk_next(engines[name], context, k),
            }
            bad.append(name)
        rows.append(row)
    df = _int_cols(pd.DataFrame(rows), "first_divergence")
    if not bad:
        return Check(
            "generation",
            True,
            f"greedy texts agree for {max_new_tokens} tokens",
            df,
            {"prompt_ids": list(ids), "reference": reference, "topk": topk},
        )
    first = df[df["engine"].isin(bad)].sort_values("first_divergence").iloc[0]
    verdict = (
        f"{first['engine']} diverges from {reference} at generated token {int(first['first_divergence'])}: "
        f"{first['engine_token']!r} vs {first['reference_token']!r} (reference top-2 margin "
        f"{first['margin_ref']:.3f} nats)"
    )
    return Check(
        "generation",
        False,
        verdict,
        df,
        {
            "position": int(first["first_divergence"]),
            "margin_ref": float(first["margin_ref"]),
            "engine": first["engine"],
            "prompt_ids": list(ids),
            "reference": reference,
            "topk": topk,
        },
    )


# --- all checks, one verdict ---------------------------------------------------------------------------
@dataclass
class Comparison:
    checks: list
    verdict: dict  # {"layer", "position", "near_tie", "engine", "text"}

    def check(self, name: str) -> Check:
        """The check ``name`` ("config", "tokenizer", "template", "logits", "generation"); LabError naming those
        this comparison ran otherwise (was: StopIteration)."""
        found = next((c for c in self.checks if c.name == name), None)
        if found is None:
            ran = ", ".join(c.name for c in self.checks) or "none"
            raise LabError(f"no {name!r} check in this comparison: it ran {ran}")
        return found

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "checks": [c.to_dict() for c in self.checks]}


def decide(checks: list[Check]) -> dict:
    """The first layer that disagrees, in the order config, tokenizer, template, numerics."""
    by = {c.name: c for c in checks}
    for layer in ("config", "tokenizer", "template"):
        c = by.get(layer)
        if c is not None and c.ok is False:
            return {"layer": layer, "position": None, "near_tie": None, "text": c.verdict}
    gen, lg = by.get("generation"), by.get("logits")
    if gen is not None and gen.ok is False:
        margin = gen.details["margin_ref"]
        return {
            "layer": "numerics",
            "position": gen.details["position"],
            "near_tie": margin < NEAR_TIE_NATS,
            "engine": gen.details["engine"],
            "margin_ref": margin,
            "text": gen.verdict
            + (
                " — a numerical near-tie, not a model, template or tokenizer fault"
                if margin < NEAR_TIE_NATS
                else " — numerics beyond a near-tie"
            ),
        }
    if lg is not None and lg.ok is False:
        return {"layer": "numerics", "position": None, "near_tie": False, "text": lg.verdict}
    # name only the checks that ran: an engine without logits (openvino) is not checked there
    words = {"generation": "greedy text"}
    agreed = [words.get(c.name, c.name) for c in checks if c.ok]
    said = ", ".join(agreed[:-1]) + f" and {agreed[-1]}" if len(agreed) > 1 else "".join(agreed)
    text = f"no disagreement found: {said} agree" if agreed else "no disagreement found: no check could run"
    skipped = [f"{c.name} ({c.verdict})" for c in checks if c.ok is None]
    skipped += [u for c in checks if c.ok for u in c.details.get("unavailable", [])]
    if skipped:
        text += "; not checked: " + "; ".join(skipped)
    return {"layer": "none", "position": None, "near_tie": None, "text": text}


def loaded_engines(loaded) -> dict:
    """``compare``'s ``loaded``: {engine name: an open Engine}, from such a dict (its names as any alias), a list of
    engines or one engine (keyed by their own names); None as {}. LabError for anything else, a closed engine, or an
    engine under another engine's name, before any engine loads (was: AttributeError on a list, a second load under
    an alias such as "hf")."""
    if loaded is None:
        return {}
    if isinstance(loaded, dict):
        pairs = list(loaded.items())
    elif isinstance(loaded, (list, tuple)):
        pairs = [(getattr(e, "name", None), e) for e in loaded]
    else:
        pairs = [(None, loaded)]
    out = {}
    for name, e in pairs:
        if not isinstance(e, Engine):
            raise LabError(
                f"loaded={shown(loaded)}: expected engines already loaded (lablib.load_engine(...)), as "
                f"{{name: engine}} or a list of them; {shown(e)} is no engine"
            )
        e.check_open()
        name = canonical(e.name if name is None else name)
        if name != e.name:  # its rows and verdict would carry the wrong engine's name
            raise LabError(f"loaded[{name!r}] is a {e.name} engine; key each loaded engine by its own name")
        out[name] = e
    return out


def compare(
    model=None,
    engines=None,
    reference: str = REFERENCE,
    prompt: str | None = None,
    messages: list | None = None,
    ids: list | None = None,
    max_new_tokens: int = 24,
    engine_models: dict | None = None,
    loaded: dict | None = None,
) -> Comparison:
    """Run the five checks on ``engines`` (default: the lab's default set that can read the model,
    :func:`lablib.engines.engines_for`) against ``reference`` and decide.

    The prompt is ``ids``, or ``messages`` rendered by the reference's chat
    template, or ``prompt`` text through the reference's tokenizer (default:
    :data:`lablib.measure.workload.DEFAULT_MESSAGES`). ``engine_models``
    maps an engine name to another model (path or ResolvedModel) for that
    engine, e.g. a suspicious MLX folder; ``loaded`` passes engines already
    loaded. Each engine loads as its library alone would read the model
    (``Engine.compare_load_kwargs``: MLX without the lab's config fixes), so the
    check sees what a plain user of that library sees.
    """
    GenerationConfig(max_new_tokens=max_new_tokens)  # a bad budget is refused before any engine loads
    if messages is not None:  # before any engine loads: not the template's own error once they have
        messages = chat_messages(messages)
    rm = resolve(model)
    names = engine_names(engines, rm)  # "llama.cpp" as one engine (was: its letters, "unknown engine 'l'")
    reference = canonical(reference)
    if reference not in names:
        names.insert(0, reference)
    loaded = loaded_engines(loaded)
    # every engine is held at once: check the whole comparison before loading any (the prompt's
    # length is known now only when ids are given; it is checked again once tokenized)
    for name in names:  # an engine that cannot read the model: said before any engine loads
        if name not in loaded and name not in (engine_models or {}):
            check_supported(name, rm)
    classes = [engine_class(n) for n in names]
    check_compare_fits(rm, classes, (len(ids) if ids is not None else 0) + max_new_tokens, LOGIT_CHUNK, loaded)
    for name in names:
        if name in loaded:
            continue
        m = (engine_models or {}).get(name, rm)
        loaded[name] = load_engine(name, resolve(m), **engine_class(name).compare_load_kwargs)
    engs = {n: loaded[n] for n in names}
    ref = engs[reference]
    prompt_format = "tokens"
    if ids is None:
        if prompt is None and not has_chat_template(rm):  # a base model: the question as raw text
            prompt = completion_text(messages or DEFAULT_MESSAGES)
        if prompt is not None:  # the BOS the model asks for, as its own tokenizer adds it (Gemma: <bos>), no EOS
            ids, prompt_format = ref.tokenize(prompt, add_special=True), "text"
            if ids and ids[-1] in ref.eos_ids and ref.tokenize(prompt)[-1:] != ids[-1:]:
                ids = ids[:-1]
        else:
            ids, prompt_format = ref.apply_chat_template(messages or DEFAULT_MESSAGES), "chat"
        check_compare_fits(rm, classes, len(ids) + max_new_tokens, LOGIT_CHUNK, loaded=names)
    for e in engs.values():  # one clear error naming the numbers before any logits are computed
        e.check_context(len(ids), max_new_tokens)
    checks = [check_config(engs, reference, rm.gguf_path, rm.hf_path)]
    checks.append(check_tokenizer(engs, reference, prompt if prompt is not None else _PROBE_TEXT))
    checks.append(check_template(engs, reference))
    checks.append(check_logits(engs, reference, list(ids)))
    checks.append(check_generation(engs, reference, list(ids), max_new_tokens))
    return Comparison(checks, {**decide(checks), "prompt_format": prompt_format})


_PROBE_TEXT = (
    "What is 3333+777? Answer: 4110.\na,b  c\n\n123456 7.5e-3\n  leading spaces\t \n"
    "naïve café — “quotes” emoji 🙂 日本語\ndef f(x):\n    return x**2  # comment\n"
)


class TokenizerView:
    """A tokenizer taking part in the tokenizer and template checks without a model:
    for example the tokenizer transformers builds from a GGUF file
    (``TokenizerView.from_gguf(path)``). ``logits``/``generate`` are not available,
    and the checks that need them say so."""

    def __init__(self, tokenizer, name: str = "tokenizer", add_special_tokens: bool = False):
        self.tok, self.name, self.add_special_tokens = tokenizer, name, add_special_tokens

    @classmethod
    def from_gguf(cls, gguf_path, name: str = "transformers (GGUF tokenizer)"):
        from transformers import AutoTokenizer

        p = Path(gguf_path)
        return cls(AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name), name)

    @property
    def bos_id(self):
        return self.tok.bos_token_id

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return list(self.tok(text, add_special_tokens=add_special)["input_ids"])

    def detokenize(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> list[int]:
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return self.tokenize(text, add_special=self.add_special_tokens)

    def logits(self, ids):
        raise NotImplementedError(f"{self.name} is a tokenizer only, it has no model")

    def iter_logits(self, ids, chunk: int = LOGIT_CHUNK):
        """Raises NotImplementedError, as :meth:`logits` does (the logit checks say so)."""
        return self.logits(ids)

    def effective_config(self) -> dict:
        raise LabError(f"{self.name} is a tokenizer only: it has no model config to compare")
