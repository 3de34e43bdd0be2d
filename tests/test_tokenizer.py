"""The lab's tokenizer (the derived HF folder's) and each engine's agree, token for token.

Case tokenizer_probe.txt: transformers' own GGUF loader builds a plain ByteLevel
split for the pre-tokenizer type "smollm" and makes "\\n\\n" two tokens (198, 198);
llama.cpp splits digits first, then the GPT-2 regex, as the original tokenizer
did, and makes it one (1116). The lab restores the GGUF's split rule when it
derives the HF folder, so every engine sees the same ids.
"""

from pathlib import Path

import pytest

from lablib.measure.workload import lab_tokenizer
from lablib.studies.cases import unescape_probe

CASES = Path(__file__).parent / "data" / "cases"


def probe_lines():
    raw = (CASES / "tokenizer_probe.txt").read_text(encoding="utf-8").splitlines()
    return [unescape_probe(ln) for ln in raw]


def test_transformers_gguf_loader_splits_double_newline_in_two(model):
    """The upstream fault the lab works around (still present in transformers 5.24)."""
    from transformers import AutoTokenizer

    gguf = Path(model.gguf_path)
    direct = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    line = probe_lines()[1]
    ids = direct(line, add_special_tokens=False)["input_ids"]
    assert ids[5:7] == [198, 198]


def test_probe_line_two_is_one_token_for_double_newline(model, llama):
    line = probe_lines()[1]  # "a,b  c\n\n123456 ..."
    lab = lab_tokenizer(model)(line, add_special_tokens=False)["input_ids"]
    assert lab[:12] == [81, 28, 82, 216, 265, 1116, 33, 34, 35, 36, 37, 38]
    assert llama.tokenize(line) == lab


def test_whole_probe_identical_in_every_engine(model, llama, hf, mlx):
    text = "\n".join(probe_lines())
    lab = lab_tokenizer(model)(text, add_special_tokens=False)["input_ids"]
    assert llama.tokenize(text) == lab
    assert hf.tokenize(text) == lab
    assert mlx.tokenize(text) == lab


@pytest.mark.parametrize(
    "text",
    [
        "a\n\n\nb",
        "x  \n  y",
        "tabs\t\t\tthen\n\t\n",
        "end with newlines\n\n",
        "  leading",
        "1\n\n2\n\n\n3",
        "price: 1,000,000.50 $",
        "def g():\n\n\n    pass\n",
        "<|im_start|>user\nhi<|im_end|>\n",
    ],
)
def test_whitespace_digit_and_special_neighbours_agree(text, model, llama, hf):
    lab = lab_tokenizer(model)(text, add_special_tokens=False)["input_ids"]
    assert llama.tokenize(text) == lab
    assert hf.tokenize(text) == lab


# The lab's tokenizer is loaded without torch (lablib.model.tokenizer): the class AutoTokenizer picks is asked once
# of a child process and kept; the load itself calls that class's own from_pretrained.

NO_TORCH = """\
import json, sys
from lablib.model import prepare
from lablib.model.tokenizer import lab_tokenizer
tok = lab_tokenizer(prepare())
text = sys.argv[1]
print(json.dumps({"torch": "torch" in sys.modules, "class": type(tok).__module__ + ":" + type(tok).__qualname__,
                  "ids": tok(text, add_special_tokens=False)["input_ids"],
                  "chat": tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                  tokenize=False)}))
"""


def _run_no_torch(text):
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", NO_TORCH, text], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_lab_tokenizer_imports_no_torch_and_equals_autotokenizer(model):
    """Twice in fresh processes (the first asks a child for the class, the second reads it back): neither imports
    torch, and both give AutoTokenizer's class, ids and chat prompt."""
    from transformers import AutoTokenizer

    from lablib.model.tokenizer import _class_cache_file

    kept = _class_cache_file(model.hf_path)
    kept.unlink(missing_ok=True)
    text = "\n".join(probe_lines())
    auto = AutoTokenizer.from_pretrained(model.hf_path)
    want = {
        "torch": False,
        "class": f"{type(auto).__module__}:{type(auto).__qualname__}",
        "ids": auto(text, add_special_tokens=False)["input_ids"],
        "chat": auto.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        ),
    }
    # transformers 5.11-5.17's tokenizer module imports torch itself (its GGUF reader, at the top): there the lab
    # cannot keep torch out, only AutoTokenizer's config path; from 5.18 (and the pin's top) nothing imports it
    want["torch"] = _transformers_tokenizer_imports_torch()
    first = _run_no_torch(text)
    assert kept.is_file()
    second = _run_no_torch(text)
    assert first == want
    assert second == want


def _transformers_tokenizer_imports_torch() -> bool:
    import subprocess
    import sys

    code = "import sys, transformers.tokenization_utils_tokenizers; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return done.stdout.strip() == "True"


def test_a_changed_tokenizer_config_is_asked_again(model, tmp_path, monkeypatch):
    """The kept class belongs to the folder's files as they were: a tokenizer_config.json naming another class
    gets that class (AutoTokenizer's choice), not the kept one."""
    import json
    import shutil

    from transformers import AutoTokenizer

    from lablib.model.tokenizer import tokenizer_class

    monkeypatch.setenv("LABLIB_HOME", str(tmp_path / "home"))
    folder = tmp_path / "tok"
    folder.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "config.json", "special_tokens_map.json"):
        if (Path(model.hf_path) / f).is_file():
            shutil.copy(Path(model.hf_path) / f, folder / f)
    before = tokenizer_class(str(folder))
    assert before is type(AutoTokenizer.from_pretrained(str(folder)))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "GPT2Tokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    after = tokenizer_class(str(folder))
    assert after is type(AutoTokenizer.from_pretrained(str(folder)))
    assert after.__name__ == "GPT2Tokenizer" and before.__name__ != "GPT2Tokenizer"
    assert len(list((tmp_path / "home" / "cache" / "tokenizer").glob("*.json"))) == 2


def test_a_kept_class_from_outside_transformers_is_not_imported(model, tmp_path, monkeypatch):
    """A kept name that is not one of transformers' tokenizer classes (a hand-edited or foreign cache file) is not
    imported; the load falls back to AutoTokenizer."""
    from lablib.model import tokenizer as t

    monkeypatch.setenv("LABLIB_HOME", str(tmp_path / "home"))
    for bad in ("os:system", "transformers.configuration_utils:PreTrainedConfig", "transformers:nothing.here"):
        t._keep_class_name(model.hf_path, bad)
        assert t._kept_class(model.hf_path) == bad
        assert t.tokenizer_class(model.hf_path) is None


def test_the_class_ask_leaves_the_callers_standard_input_alone(model, tmp_path, monkeypatch):
    """A folder with its own tokenizer code (tokenizer_config.json's auto_map): AutoTokenizer asks "Do you wish to
    run the custom code? [y/N]" on standard input. The child that asks for the class read the caller's (a script's
    piped input, a terminal: a silent 15 s wait) and ran the folder's code on the first "y" there."""
    import json
    import shutil
    import subprocess
    import sys

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))  # where an accepted folder's code is copied
    folder = tmp_path / "custom"
    folder.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(Path(model.hf_path) / f, folder / f)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.update(tokenizer_class="MyTokenizer", auto_map={"AutoTokenizer": [None, "tok.MyTokenizer"]})
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    (folder / "tok.py").write_text(
        "from transformers import TokenizersBackend\nclass MyTokenizer(TokenizersBackend): pass\n"
    )
    code = "import sys; from lablib.model.tokenizer import _ask_class; print(_ask_class(sys.argv[1])); print(repr(sys.stdin.read()))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(folder)], input="y\nmy prompt\n", capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["None", repr("y\nmy prompt\n")]
    assert not (tmp_path / "modules").exists()


def test_a_kept_class_that_is_not_a_name_is_asked_again(model, tmp_path, monkeypatch):
    """A cache file whose class is JSON but no name (a hand edit, another tool's file) is one that cannot be read:
    asked again, not an AttributeError from the load."""
    from lablib.model import tokenizer as t

    monkeypatch.setenv("LABLIB_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(t, "_ask_class", lambda path: None)  # the child's answer is not what is tested here
    kept = t._class_cache_file(model.hf_path)
    kept.parent.mkdir(parents=True)
    for bad in ('{"class": 5}', '{"class": ["a"]}', '{"class": {"module": "transformers"}}'):
        kept.write_text(bad)
        assert t._kept_class(model.hf_path) is None
        assert t.tokenizer_class(model.hf_path) is None
