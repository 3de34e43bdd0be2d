"""`lablib doctor`: is each engine usable here, and why not (exit 0: every default engine usable)."""

from __future__ import annotations

from lablib._version import __version__
from lablib.config import LOW_DISK_BYTES, home_usage
from lablib.engines import NAMES
from lablib.engines.doctor import check_engines, gpu_build_facts, gpu_build_warnings
from lablib.errors import LabError
from lablib.machine.identity import describe as describe_devices, found as found_devices, hardware_info, load_average
from lablib.machine.limits import available_ram_bytes
from lablib.machine.telemetry import doctor_lines as telemetry_lines
from lablib.machine.threads import cpus_busy, default_threads
from lablib.model.resolve import prepare

BUSY_CPUS = 0.3  # doctor warns when other processes keep at least this many CPUs busy
HELP = "is each engine usable here, and why not (exit 0: every default engine that reads the model is usable)"


def add_arguments(p) -> None:
    p.add_argument("--model", default=None)


def home_lines(usage: dict | None = None) -> list[str]:
    """What the lab home holds and the disk's free space, with a warning when that is low (:func:`home_usage`)."""
    u = usage or home_usage()
    gib = 2**30
    big = ", ".join(f"{name} {b / gib:.1f}" for name, b in u["folders"].items() if b >= 0.05 * gib)
    held = f"{u['total'] / gib:.1f} GiB" + (f" ({big} GiB)" if big else "")
    if u.get("error"):
        held = f"cannot read it ({u['error']}): the lab writes its models and caches there; set LABLIB_HOME to a folder you own"
    free = "free space unknown" if u["free"] is None else f"{u['free'] / gib:.1f} GiB free on its disk"
    lines = [f"lab home: {u['home']}, {held}; {free}"]
    if u["free"] is not None and u["free"] < LOW_DISK_BYTES:
        lines.append(
            f"WARNING: the disk holding the lab home has {u['free'] / gib:.1f} GiB free (less than "
            f"{LOW_DISK_BYTES / gib:.0f} GiB): a quantization ladder, an ONNX export or vLLM's environment writes "
            f"several GB, and a full disk fails them half way. Free space, or delete folders of {u['home']} you no "
            "longer need (the lab makes models/, quant/, adapters/ and onnx/ again when asked, and downloads envs/ "
            "and wheels/ again), or set LABLIB_HOME to a folder on a larger disk"
        )
    return lines


def run(ns) -> int:
    hw = hardware_info()
    print(f"lablib {__version__}, Python {hw['python']}, {hw['os']} {hw['machine']}")
    print(
        f"CPU: {hw['cpu_model']}, {hw['cores_physical']} cores, RAM {hw['ram_bytes'] / 2**30:.1f} GiB, "
        f"accelerator: {hw['accelerator'] or 'none'}"
    )
    devices = found_devices()
    print(f"devices the engines can compute on: {describe_devices(devices)}")
    for line in gpu_build_warnings(gpu_build_facts([d.name for d in devices if d.kind == "cuda"])):
        print(line)
    for line in telemetry_lines():  # the GPU through NVML (driver, CUDA version) and the CPU's RAPL energy
        print(line)
    if hw["cpu_quota"] or hw["memory_limit_bytes"]:
        limit = hw["memory_limit_bytes"]
        print(
            f"container caps: CPU {hw['cpu_quota'] or 'no cap'}"
            f"{' CPUs' if hw['cpu_quota'] else ''}, memory "
            f"{f'{limit / 2**30:.1f} GiB' if limit else 'no cap'}"
        )
    print(f"engines will use {default_threads()} threads; {available_ram_bytes() / 2**30:.1f} GiB free for them")
    busy = cpus_busy()
    if busy >= BUSY_CPUS:
        print(
            f"WARNING: the machine is busy: other processes keep {busy:.1f} of {hw['cores_logical']} CPUs busy "
            f"(load average {load_average()}). Timings will be slower and noisier than on a quiet machine; "
            "close what runs (a browser tab, a build) or measure with fewer threads (LABLIB_THREADS=1)"
        )
    for line in home_lines():
        print(line)
    try:
        rm = prepare(ns.model, log=lambda *_: None)
        print(f"model: {rm.name} ({rm.source_format}, {rm.quantization}, {rm.parameters / 1e6:.0f}M parameters)")
    except LabError as e:
        print(f"model: NOT READY: {e}")
        return 1
    if rm.unavailable:
        for fmt, why in rm.unavailable.items():
            print(f"  no {fmt.upper()} format for it: {why}")
    ok = True
    checks = check_engines(ns.model, resolved=rm)
    width = max((len(r["engine"]) for r in checks), default=13)
    for r in checks:
        # an optional engine (outside the default set) whose package is not installed is not a fault, nor an
        # engine that cannot read this model (it is left out of the model's default set, and says why)
        optional_absent = r["engine"] not in NAMES and r["detail"].startswith("not installed")
        unsupported = r.get("supported") is False
        ok &= r["usable"] or optional_absent or unsupported
        state = (
            "usable"
            if r["usable"]
            else "not installed (optional)"
            if optional_absent
            else "does not run this model"
            if unsupported
            else "NOT USABLE"
        )
        print(f"  {r['engine']:<{width}} {state}: {r['detail']}")
    runs = [r["engine"] for r in checks if r["usable"] and r["engine"] in NAMES]
    if not runs:
        print(f"no engine of the lab's default set ({', '.join(NAMES)}) runs {rm.name}")
        ok = False
    elif len(runs) < len(NAMES):
        print(f"for this model the lab runs {', '.join(runs)} when no engine is named")
    print(f"servers: {vllm_line()}")
    return 0 if ok else 1


def vllm_line(st: dict | None = None) -> str:
    """vLLM's environment in one line (``st``: :func:`lablib.build.vllm.status`'s answer, None: this machine's):
    the build this machine gets (the CPU build, or the CUDA build beside a GPU it supports), installed or not,
    or why the CUDA build is refused here and what to do; optional, so never a fault."""
    from lablib.build.vllm import BUILD_ENV, BUILDS, status

    st = st if st is not None else status()
    choice = st.get("choice") or {}
    build = BUILDS[choice.get("build") or choice.get("wanted") or "cpu"]
    what = f"{build.label}, {build.spec}"
    if st.get("state") == "refused":
        return (
            f"vllm: {build.label} cannot run here ({choice.get('reason')}); `{BUILD_ENV}=cpu make vllm` installs "
            "the CPU build instead (it serves on the CPU)"
        )
    if st.get("installed"):
        size = f", {st['bytes'] / 1e9:.1f} GB" if st.get("bytes") else ""
        return f"vllm ({what}) installed in {st['path']}{size}"
    if st.get("state") == "broken":
        return f"vllm ({what}) environment broken ({st.get('reason')}): `make vllm` installs it again"
    return f"vllm ({what}) not installed (optional): `make vllm` or the first `lablib serve --server vllm` installs it"
