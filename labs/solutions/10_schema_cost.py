# Solution · lab 10 · a schema of your own
#
# A grammar adds work at every step: llama.cpp's sampler checks the candidate tokens against the grammar's
# state before it picks one, so the constrained TPOT is above the free one (on the lab's machine about 1.3-1.6x
# for schemas like this). The compile is a millisecond or less, and less again when the grammar is cached.
# Without the constraint the model does not answer with JSON that validates; with it every answer does.
#
# "uniqueItems" is a keyword a grammar cannot express in general (it would have to remember every item so far):
# llama.cpp's converter accepts the schema and ignores the keyword, so a constrained answer may still repeat an
# item (only the jsonschema check of the answer would say so); llguidance (transformers) and vLLM refuse the
# schema with one message naming the part (properties.items.uniqueItems).
#
# What it printed on the 2-core machine the lab was written on:
#   compile 0.79 ms first, 0.31 ms cached; TPOT free 12.9 ms, constrained 28.4 ms (2.19x); valid free 0%, constrained 100%
#   a constrained answer: { "items": [{"name": "Ava", "quantity": 1}, {"name": "Ava", "quantity": 2}, {"name": "Ava", "quantity": 3}], "status": "paid"}
#   llama.cpp: accepted uniqueItems; valid constrained 1
#   transformers: transformers cannot compile json_schema 'unique_order' at properties.items.uniqueItems: llguidance: Unimplemented keys: ["uniqueItems"]. Expected a schema the engine's grammar compiler supports; rewrite or drop that part (lookarounds, backreferences and some keywords have no grammar form) or use another engine
import lablib
from lablib.engines.base import Constraint
from lablib.studies.decoding import structured as so

model = lablib.prepare()
order = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 20},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                },
                "required": ["name", "quantity"],
                "additionalProperties": False,
            },
        },
        "status": {"enum": ["new", "paid", "shipped"]},
    },
    "required": ["items", "status"],
    "additionalProperties": False,
}
with lablib.load_engine("llama.cpp", model, n_ctx=1024) as llama:
    rows = so.structured_rows(llama, [Constraint.json_schema(order, "my_order")], max_new_tokens=80, reps=1)
t = so.structured_table(rows).iloc[0]
print(
    f"compile {t['compile_first_s'] * 1e3:.2f} ms first, {t['compile_cached_s'] * 1e3:.2f} ms cached; "
    f"TPOT free {t['tpot_free_s'] * 1e3:.1f} ms, constrained {t['tpot_constrained_s'] * 1e3:.1f} ms "
    f"({t['tpot_constrained_s'] / t['tpot_free_s']:.2f}x); valid free {t['valid_free']:.0%}, "
    f"constrained {t['valid_constrained']:.0%}"
)
print("a constrained answer:", next(r["text"] for r in rows if r["constrained"]))

unique = {
    **order,
    "properties": {**order["properties"], "items": {**order["properties"]["items"], "uniqueItems": True}},
}
for name in ("llama.cpp", "transformers"):
    with lablib.load_engine(name, model, n_ctx=1024) as engine:
        try:
            rows = so.structured_rows(
                engine, [Constraint.json_schema(unique, "unique_order")], max_new_tokens=80, reps=0
            )
            print(
                f"{name}: accepted uniqueItems; valid constrained {sum(r['valid'] for r in rows if r['constrained'])}"
            )
        except lablib.LabError as e:
            print(f"{name}: {e}")
