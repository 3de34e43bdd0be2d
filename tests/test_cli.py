"""The `lablib` command as a user runs it (real engines, real model)."""

import json
import subprocess
import sys

import pytest

from lablib.results.trace import METRICS


def lablib(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "lablib.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_import_lablib_stays_light():
    code = (
        "import sys, lablib; heavy = [m for m in ('torch', 'llama_cpp', 'mlx', 'transformers', 'numpy')"
        " if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("engine", ["llama.cpp", "transformers", "mlx"])
def test_run_json_for_each_engine(engine):
    p = lablib("run", "--engine", engine, "--max-new-tokens", "5", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    for key in (*METRICS, "engine", "prompt_tokens", "output_tokens", "text"):
        assert key in out
    assert out["engine"] == engine
    assert out["prompt_tokens"] == 37  # the default chat prompt, ids of first_token_flip.json
    assert out["output_tokens"] == 5 == len(out["token_ids"])
    assert out["ttft_s"] >= out["prefill_s"] > 0 and out["e2e_s"] >= out["ttft_s"]
    m = out["manifest"]
    assert m["model"]["quantization"] == "Q4_1" and len(m["model"]["file_sha256"]) == 64
    assert m["engine"]["name"] == engine and m["engine"]["version"]
    assert m["hardware"]["cores_physical"] >= 1 and m["hardware"]["ram_bytes"] > 0
    assert m["lablib_version"] and m["time"]


def test_run_with_prompt_tokens_and_plain_output():
    p = lablib("run", "--engine", "llama.cpp", "--prompt-tokens", "100", "--max-new-tokens", "3")
    assert p.returncode == 0, p.stderr
    assert "100 prompt tokens (tokens) -> 3 output tokens" in p.stdout and "TTFT" in p.stdout


def test_context_overflow_is_one_clear_error():
    p = lablib("run", "--engine", "llama.cpp", "--prompt-tokens", "600", "--n-ctx", "512", "--max-new-tokens", "16")
    assert p.returncode == 2
    assert "context overflow on llama.cpp: prompt 600 + output 16 = 616 tokens" in p.stderr
    assert "Traceback" not in p.stderr
    # what to change, as the command's flags (was "lower max_new_tokens", the Python keyword)
    assert "fewer output tokens (--max-new-tokens ...)" in p.stderr and "(--n-ctx ...;" in p.stderr


def test_run_names_its_prompt_tokens_flag_for_a_length_below_one():
    p = lablib("run", "--engine", "llama.cpp", "--prompt-tokens", "0", "--max-new-tokens", "2")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--prompt-tokens 0: expected a prompt length in tokens" in p.stderr, p.stderr


def test_unknown_engine_is_one_clear_error():
    p = lablib("run", "--engine", "vllm", "--max-new-tokens", "2")
    assert p.returncode == 2 and "unknown engine 'vllm'" in p.stderr and "llama.cpp" in p.stderr


def test_prepare_twice_is_a_cache_hit():
    lablib("prepare")
    p = lablib("prepare")
    assert p.returncode == 0 and "(cached)" in p.stdout and "hf" in p.stdout and "mlx" in p.stdout


def test_doctor_finds_every_engine_usable_and_lists_the_devices():
    from lablib.engines import IN_PROCESS
    from lablib.machine.identity import describe, found

    p = lablib("doctor")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count(" usable:") == len(IN_PROCESS)
    assert f"devices the engines can compute on: {describe(found())}\n" in p.stdout
    assert ", on cpu: generated 2 tokens" in p.stdout or any(g in p.stdout for g in (", on cuda:", ", on metal:"))
    from lablib.config import lab_home

    assert f"lab home: {lab_home()}, " in p.stdout and " GiB free on its disk" in p.stdout


def test_the_lab_homes_size_counts_each_file_once_and_follows_no_link(tmp_path):
    """home_usage: bytes per top folder, largest first; a hard link is the same bytes, a symbolic link (to a big
    file outside the home) is not the home's."""
    import os

    from lablib.config import home_usage

    home = tmp_path / "home"
    (home / "models" / "m" / "hf").mkdir(parents=True)
    (home / "quant").mkdir()
    (home / "models" / "m" / "hf" / "w.bin").write_bytes(b"x" * 1000)
    os.link(home / "models" / "m" / "hf" / "w.bin", home / "models" / "m" / "same.bin")
    (home / "quant" / "q.gguf").write_bytes(b"y" * 3000)
    (tmp_path / "outside.bin").write_bytes(b"z" * 50_000)
    (home / "quant" / "link.gguf").symlink_to(tmp_path / "outside.bin")
    (home / "hashes.json").write_bytes(b"{}")
    u = home_usage(home)
    assert u["folders"] == {"quant": 3000, "models": 1000, "hashes.json": 2}
    assert list(u["folders"]) == ["quant", "models", "hashes.json"] and u["total"] == 4002
    assert u["home"] == str(home) and u["free"] > 0
    missing = home_usage(tmp_path / "not-yet")
    assert missing["folders"] == {} and missing["total"] == 0 and missing["free"] > 0


def test_a_lab_home_this_user_cannot_read_is_said_not_raised(tmp_path, monkeypatch):
    """A home (or a folder above it) this user may not list: home_usage says why, doctor prints it in one line
    (a helper found doctor ending in a PermissionError traceback). Root reads any folder, so the refusal is the
    one the operating system gives a user without the permission, raised where the home is listed."""
    import pathlib

    from lablib.cli.doctor import home_lines
    from lablib.config import home_usage

    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    listed = pathlib.Path.iterdir

    def iterdir(self):
        if self == home:
            raise PermissionError(13, "Permission denied", str(home))
        return listed(self)

    monkeypatch.setattr(pathlib.Path, "iterdir", iterdir)
    u = home_usage(home)
    assert u["error"] == "PermissionError: Permission denied" and u["folders"] == {} and u["free"] > 0
    (line,) = home_lines(u)
    assert line.startswith(f"lab home: {home}, cannot read it (PermissionError: Permission denied)")
    assert "set LABLIB_HOME to a folder you own" in line and "GiB free on its disk" in line
    assert home_lines(dict(u, free=None))[0].endswith("; free space unknown")


def test_doctor_warns_when_the_lab_homes_disk_is_nearly_full():
    from lablib.cli.doctor import home_lines
    from lablib.config import LOW_DISK_BYTES

    gib = 2**30
    usage = {"home": "/h", "folders": {"models": 7 * gib, "quant": 3 * gib, "hashes.json": 10}, "total": 10 * gib}
    low = home_lines(dict(usage, free=LOW_DISK_BYTES - gib))
    assert (
        low[0]
        == f"lab home: /h, 10.0 GiB (models 7.0, quant 3.0 GiB); {(LOW_DISK_BYTES - gib) / gib:.1f} GiB free on its disk"
    )
    assert len(low) == 2 and low[1].startswith("WARNING: the disk holding the lab home has") and "LABLIB_HOME" in low[1]
    high = home_lines(dict(usage, free=LOW_DISK_BYTES + gib))
    assert len(high) == 1 and high[0].endswith(f"{(LOW_DISK_BYTES + gib) / gib:.1f} GiB free on its disk")


def test_a_context_that_will_not_fit_in_memory_is_refused_before_llama_cpp_allocates():
    p = lablib("run", "--engine", "llama.cpp", "--n-ctx", "100000000", "--max-new-tokens", "2")
    assert p.returncode == 2, p.stderr
    assert "memory: llama.cpp needs about" in p.stderr and "for 1 x 100000000 tokens" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("value", ["abc", "0"])
def test_bad_lablib_threads_is_one_clear_error(value):
    import os

    p = subprocess.run(
        [sys.executable, "-m", "lablib.cli", "run", "--engine", "llama.cpp", "--max-new-tokens", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, LABLIB_THREADS=value),
    )
    assert p.returncode == 2 and f"LABLIB_THREADS='{value}'" in p.stderr and "Traceback" not in p.stderr


def test_bad_flags_are_refused_before_the_tokenizer_or_an_engine_loads():
    """`lablib run` checks --n-ctx and LABLIB_THREADS first: refusing them loaded transformers' tokenizer before
    (5-10 s to say a flag is wrong); now none of torch, transformers or llama_cpp is imported when it refuses."""
    import os

    probe = (
        "import sys; from lablib.cli import main; rc = main(sys.argv[1:]); "
        "print(rc, sorted(m for m in ('torch', 'transformers', 'llama_cpp') if m in sys.modules))"
    )
    for env, args in (
        ({}, ["run", "--engine", "transformers", "--n-ctx=0", "--max-new-tokens", "2"]),
        ({"LABLIB_THREADS": "abc"}, ["run", "--engine", "llama.cpp", "--max-new-tokens", "2"]),
    ):
        p = subprocess.run(
            [sys.executable, "-c", probe, *args], capture_output=True, text=True, env=dict(os.environ, **env)
        )
        assert p.stdout.split("\n")[-2] == "2 []", (args, env, p.stdout, p.stderr)


@pytest.mark.parametrize("n_ctx", ["0", "-5"])
def test_a_zero_or_negative_context_is_refused_not_defaulted(n_ctx):
    p = lablib("run", "--engine", "transformers", f"--n-ctx={n_ctx}", "--max-new-tokens", "2")
    assert p.returncode == 2 and f"--n-ctx {n_ctx}: expected a positive whole number" in p.stderr


@pytest.mark.parametrize(
    "args,says",
    [
        (
            ["run", "--engine", "llama.cpp", "--max-new-tokens", "0"],
            "--max-new-tokens 0: expected a whole number of tokens, at least 1",
        ),
        (
            ["run", "--engine", "llama.cpp", "--max-new-tokens", "2", "--warmup", "-1"],
            "--warmup -1: expected 0 or more",
        ),
        (
            ["run", "--engine", "transformers", "--max-new-tokens", "2", "--top-k", "-1"],
            "--top-k -1: expected a whole number of tokens, 0 (off) or more",
        ),
        (
            ["run", "--engine", "llama.cpp", "--max-new-tokens", "2", "--n-ctx", "0"],
            "--n-ctx 0: expected a positive whole number of tokens (or leave it out for the default)",
        ),
        (
            ["sweep", "concurrency", "--engines", "llama.cpp", "--mode", "fast", "--out", "OUT"],
            "--mode ['fast']: expected one or more of serial, batched",
        ),
        (
            ["bench", "--base-url", "http://127.0.0.1:9/v1", "--rate", "1", "--max-concurrency", "0"],
            "--max-concurrency 0: expected a whole number of requests in flight, at least 1",
        ),
        (
            ["bench", "--base-url", "http://127.0.0.1:9/v1", "--concurrency", "1", "--ttft-target-s", "0"],
            "--ttft-target-s 0.0: expected a positive number of seconds (a goodput target; None or left out: no target)",
        ),
    ],
)
def test_a_refusal_names_the_flag_typed_not_the_python_keyword(args, says, tmp_path, capsys):
    """The library's refusals name its keywords (max_new_tokens=0); the command line said them so too, though the
    user typed --max-new-tokens 0. Now `lablib` says each as the flag, a keyword that differs from its flag's name
    included (bench: concurrency= is --max-concurrency in an open loop, ttft_s= is --ttft-target-s)."""
    from lablib.cli import main

    if args[0] == "bench":
        args = [*args, "--requests", "2", "--prompt-tokens", "8", "--max-new-tokens", "2", "--out", "OUT"]
    args = [str(tmp_path / "x.jsonl") if a == "OUT" else a for a in args]
    assert main(args) == 2
    assert capsys.readouterr().err == f"lablib: {says}\n"


def test_the_flags_rewording_touches_only_a_keyword_followed_by_equals():
    from lablib.cli import in_flags

    names = {"max_new_tokens": "--max-new-tokens", "server_model": "--model", "n_ctx": "--n-ctx"}
    assert in_flags("max_new_tokens=0: expected", names) == "--max-new-tokens 0: expected"
    assert in_flags("pass server_model= one of the ids", names) == "pass --model one of the ids"
    # another keyword ending in a known one, a word without '=', and an attribute are left as they are
    said = "short_max_new_tokens=3; max_new_tokens is set; engine.n_ctx=5"
    assert in_flags(said, names) == said
    # a path or a quoted value holding one is shown as typed (a folder per setting: runs/n_ctx=512/)
    said = "results file runs/server_model=smol/n_ctx=2.txt: expected a name ending in .jsonl; 'n_ctx=3'"
    assert in_flags(said, names) == said


@pytest.mark.parametrize(
    "args,flag,given",
    [
        (["bench", "--base-url", "http://127.0.0.1:9/v1", "--rate", "1,,2"], "--rate", "1,,2"),
        (["sweep", "context", "--engines", "llama.cpp,,mlx"], "--engines", "llama.cpp,,mlx"),
        (["sweep", "context", "--engines", "llama.cpp", "--prompt-tokens", "16,32,"], "--prompt-tokens", "16,32,"),
        (["quantize", "--types", "Q8_0,,Q4_0", "--no-measure"], "--types", "Q8_0,,Q4_0"),
        (["speculate", "--parallel", ",1"], "--parallel", ",1"),
    ],
)
def test_an_empty_item_in_any_comma_list_is_one_refusal_naming_the_flag(args, flag, given, tmp_path, capsys):
    """`--rate 1,,2` was refused ("rate ''") while `--engines a,,b` ran a and b: the lists had parsers of their own.
    Now every comma list is read by lablib.checks.csv_list: an empty item is refused, naming the flag and the text."""
    from lablib.cli import main

    if args[0] == "bench":
        args = [*args, "--requests", "2", "--prompt-tokens", "8", "--max-new-tokens", "2"]
    if args[0] in ("bench", "sweep"):
        args = [*args, "--out", str(tmp_path / "x.jsonl")]
    assert main(args) == 2
    example = {"--rate": "0.5,1,2", "--prompt-tokens": "64,256"}.get(flag, "a,b")
    assert capsys.readouterr().err == (
        f"lablib: {flag} {given!r}: an empty item (two commas together, or one at an end); expected values "
        f"separated by single commas, e.g. {example}\n"
    )


def test_an_empty_draft_list_is_refused_not_a_run_without_drafts(capsys):
    """`--draft ''` reads as no items; a draft-model run with none would have measured nothing drafted."""
    from lablib.cli import main

    assert main(["speculate", "--engine", "llama-server", "--draft", ""]) == 2
    assert capsys.readouterr().err == (
        "lablib: --draft '': expected at least one draft GGUF kind or path, e.g. Q4_0,Q2_K\n"
    )
    # drafts for engines that take none: refused before anything runs (was: ignored, the run measured without)
    assert main(["speculate", "--engine", "llama.cpp,vllm", "--draft", "Q9_9"]) == 2
    assert capsys.readouterr().err == (
        "lablib: --draft 'Q9_9': only a server that drafts with a model (llama-server) takes draft GGUFs, and none "
        "of llama.cpp, vllm does; add llama-server to the engines, or give no drafts\n"
    )


def test_an_unknown_quantization_type_is_said_with_the_flag_of_its_command(tmp_path, capsys):
    """quantize's --types and quality's --variant each in its own words (was: --types in both)."""
    from lablib.cli import main

    assert main(["quality", "--engine", "llama.cpp", "--variant", "bogus", "--out", str(tmp_path / "q.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lablib: unknown quantization type(s) BOGUS;") and err.endswith("Example: --variant Q8_0\n")
    assert main(["quantize", "--types", "Q9_9"]) == 2
    assert capsys.readouterr().err.endswith("Example: --types Q8_0\n")
    assert not (tmp_path / "q.jsonl").exists()


def test_doctor_passes_when_only_an_optional_engine_is_not_installed(monkeypatch, capsys):
    """An engine outside the default set whose package is absent is listed, not a failure; a
    default engine that is absent fails."""
    from lablib import cli
    from lablib.cli import doctor
    from lablib.engines import NAMES

    def checks(absent, unsupported=()):
        return lambda model=None, resolved=None: [
            {"engine": n, "usable": n != absent, "detail": "not installed (no module 'x'); pip install x"}
            if n == absent
            else {"engine": n, "usable": False, "supported": False, "detail": "reads llama only"}
            if n in unsupported
            else {"engine": n, "usable": True, "detail": "ok"}
            for n in (*NAMES, "onnxruntime-genai")
        ]

    monkeypatch.setattr(doctor, "check_engines", checks("onnxruntime-genai"))
    assert cli.main(["doctor"]) == 0
    assert "onnxruntime-genai not installed (optional): not installed (no module 'x')" in capsys.readouterr().out
    monkeypatch.setattr(doctor, "check_engines", checks("llama.cpp"))
    assert cli.main(["doctor"]) == 1
    import re

    assert re.search(r"llama\.cpp\s+NOT USABLE: not installed", capsys.readouterr().out)
    # an engine that cannot read the model is said, and left out: an optional one is no fault, nor a default one
    # while another default engine runs the model; none of the default set running it is
    monkeypatch.setattr(doctor, "check_engines", checks(None, unsupported=("onnxruntime-genai", "mlx")))
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"mlx\s+does not run this model: reads llama only", out)
    assert "for this model the lab runs transformers, llama.cpp when no engine is named" in out
    monkeypatch.setattr(doctor, "check_engines", checks(None, unsupported=NAMES))
    assert cli.main(["doctor"]) == 1
    assert "no engine of the lab's default set" in capsys.readouterr().out


def test_a_ctrl_c_while_the_flags_are_read_is_one_line_not_a_traceback(monkeypatch, capsys):
    """Ctrl-C in a command's first quarter second (its parser imports every command's flags) printed a
    KeyboardInterrupt traceback. Here a real SIGINT comes while the parser is built: one line, exit 130."""
    import signal

    import lablib.cli

    real = lablib.cli.build_parser

    def interrupted():
        signal.raise_signal(signal.SIGINT)  # Python's handler raises KeyboardInterrupt here, as on a terminal
        return real()

    monkeypatch.setattr(lablib.cli, "build_parser", interrupted)
    prior = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job (CI) inherits it ignored
    try:
        rc = lablib.cli.main(["bench", "--base-url", "http://127.0.0.1:9/v1", "--out", "x.jsonl"])
    except KeyboardInterrupt:  # else pytest takes it for its own Ctrl-C and stops the session
        pytest.fail("KeyboardInterrupt escaped lablib.cli.main: the user saw a traceback")
    finally:
        signal.signal(signal.SIGINT, prior)
    err = capsys.readouterr().err
    assert rc == 130 and err == "lablib: interrupted (Ctrl-C) before the command began; nothing was done\n"
