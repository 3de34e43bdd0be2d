# Solution · lab 04 · which texts split differently?
#
# Three tokenizers of the same model: llama.cpp's (from the GGUF), the lab's
# transformers folder (derived with the original SmolLM2 rule restored), and
# the one transformers builds from the GGUF alone (no rule for the GGUF's
# `smollm` pre-tokenizer, so a plain byte-level split). The original rule puts
# every digit in a piece of its own *before* the GPT-2 split; that cuts a run
# of whitespace off from the digit after it, so the run stays whole ("\n\n",
# "  ", "\n    " are single tokens). The plain split cuts the run's last
# whitespace character off (the GPT-2 split saves it for the word that
# follows), and so makes one token more. Hence the rule to predict with: the two differ exactly where
# two or more whitespace characters come right before a digit. Plain prose, a
# blank line before a word, one space before a number, long numbers (each
# digit is a token in both: the vocabulary has no multi-digit tokens) and
# indented code before a letter all agree. The lab's transformers folder agrees
# with llama.cpp everywhere: its derived tokenizer carries the original rule.
# A tokenizer difference this small still changes every later position's ids,
# which is why the lab tokenizes once and feeds all engines the same ids.
#
# What it printed on the 2-core machine the lab was written on (30 s):
#      one blank line: tokens 8 / 8 / 8: tokenizers agree
#        blank, digit: tokens 5 / 5 / 6: transformers (GGUF tokenizer) differs from llama.cpp at token 2: ['\n', '\n', '4'] [198, 198, 36] vs ['\n\n', '4', '2'] [1116, 36, 34]
#     one space, digit: tokens 6 / 6 / 6: tokenizers agree
#     two spaces, digit: tokens 6 / 6 / 7: transformers (GGUF tokenizer) differs from llama.cpp at token 2: [' ', ' ', '1'] [216, 216, 33] vs ['  ', '1', '0'] [256, 33, 32]
#         long number: tokens 18 / 18 / 18: tokenizers agree
#       indented code: tokens 8 / 8 / 8: tokenizers agree
#      indented digit: tokens 8 / 8 / 9: transformers (GGUF tokenizer) differs from llama.cpp at token 5: ['\n   ', ' ', '2'] [472, 216, 34] vs ['\n    ', '2', ']'] [2367, 34, 77]
#     (tokens: llama.cpp / transformers on the lab's folder / transformers from the GGUF)
import lablib
from lablib.studies import compare as cmp

model = lablib.prepare()
llama = lablib.load_engine("llama.cpp", model)
hf = lablib.load_engine("transformers", model)
gguf_tok = cmp.TokenizerView.from_gguf(model.gguf_path)
texts = {
    "one blank line": "First line.\n\nSecond line.",
    "blank, digit": "Total:\n\n42",
    "one space, digit": "Price: 100",
    "two spaces, digit": "Price:  100",
    "long number": "In 2024 it cost 1234567 euros.",
    "indented code": "def f(x):\n    return x",
    "indented digit": "x = [1,\n    2]",
}
try:
    for label, text in texts.items():
        tok = cmp.check_tokenizer({"llama.cpp": llama, "transformers": hf, gguf_tok.name: gguf_tok}, "llama.cpp", text)
        counts = dict(zip(tok.table["engine"], tok.table["n_tokens"]))
        print(
            f"{label:>15}: tokens {counts['llama.cpp']} / {counts['transformers']} / {counts[gguf_tok.name]}: {tok.verdict}"
        )
    print("(tokens: llama.cpp / transformers on the lab's folder / transformers from the GGUF)")
finally:
    llama.close()
    hf.close()
