"""OpenAI-compatible servers the lab starts and stops itself, on the lab's model.

Each server runs as a child process on 127.0.0.1 and a free port, with its log under
``$LABLIB_HOME/servers/``; it is ready when its health or models endpoint answers, and
it is stopped by its own process id (SIGTERM, then SIGKILL after a grace period). It runs in
a session of its own (a Ctrl-C in the lab's terminal does not reach it), and dies with the
process that started it, even under ``kill -9`` or a restarted kernel (Linux:
:func:`lablib.children.popen`, whichever thread calls :func:`start_server`).

=====================  ===========================================  ==========================
name                   what runs                                    slots (``parallel``)
=====================  ===========================================  ==========================
``llama-cpp-python``   ``python -m llama_cpp.server`` on the GGUF   1 (a serial queue)
``mlx``                ``python -m mlx_lm.server`` on the MLX       ``--decode-concurrency``
                       folder                                       (continuous batching)
``llama-server``       llama.cpp's own server, built from the same  ``--parallel N`` slots
                       source and CPU flags as the in-process
                       engine (:func:`lablib.build.llama.llama_tool`)
``transformers``       ``transformers serve`` on the HF folder      ``--continuous-batching``
                                                                     when N > 1
``vllm``               vLLM (in an environment of its own:          ``--max-num-seqs N``
                       :mod:`lablib.build.vllm`) on the HF folder:  (continuous batching,
                       its CUDA build beside an NVIDIA GPU it       chunked prefill)
                       supports, else its CPU build; ``vllm-cpu``:
                       its CPU build whatever the machine
=====================  ===========================================  ==========================

Everything the lab knows of a server it starts is one row of :data:`SERVERS` (a :class:`Server`):
how to start it (``command``), its in-process ``twin`` engine (lab 05 compares the two), how it
streams (``profile``: the http engine's :class:`lablib.engines.http.ServerProfile` for its kind,
which also covers the servers the lab only measures: any other OpenAI-compatible one), how long
its first start may take and the other names it goes by. A command returns a :class:`Launch`:
the argv, and the environment and settings it starts the server with (recorded with every run).

The package, one concern per module (the public names below are re-exported here):

- :mod:`lablib.engines.servers.launch`: :class:`Server` (a row) and :class:`Launch` (one start's argv,
  environment and settings);
- :mod:`lablib.engines.servers.registry`: :data:`SERVERS`, :data:`ALIASES`, :data:`ALIAS_OPTIONS` (an alias's
  choice: ``vllm-cpu`` is vLLM's CPU build), :func:`canonical_server`, :func:`server_command`, :func:`server_options`, :data:`SPECULATION`, :func:`speculation_methods`,
  :func:`speculation_options`, :data:`ADAPTER_SERVERS` and :func:`check_adapters` (LoRA adapters served beside the
  model, ``options={"adapters": [...]}``: llama-server, vLLM);
- :mod:`lablib.engines.servers.process`: :func:`start_server`, :class:`RunningServer`, :func:`free_port`,
  :data:`KILLED_EXIT_S`, :func:`changed_steps` (the readiness wait's progress lines);
- :mod:`lablib.engines.servers.llama_server`: llama-server's command, :data:`LLAMA_SERVER_BATCH`,
  :data:`LLAMA_SERVER_UBATCH`;
- :mod:`lablib.engines.servers.vllm`: vLLM's command, :data:`VLLM_BLOCK_TOKENS`, :func:`vllm_dtype`,
  :func:`vllm_kv_space_gib`, :func:`vllm_lora_args` (its LoRA flags);
- :mod:`lablib.engines.servers.python_servers`: llama-cpp-python's server, mlx_lm.server, ``transformers serve``;
- :mod:`lablib.engines.servers.proxy`: :func:`start_buffering_proxy`, a reverse proxy that buffers (as nginx does
  by default) in front of a server started here: a stream that arrives whole, its decode hidden in TTFT.

A test that replaces a private name (``_wait_ready``, ``_vllm``, ...) patches the module that defines it.
"""

from __future__ import annotations

from lablib.engines.servers.launch import Launch, Server  # noqa: F401
from lablib.engines.servers.llama_server import LLAMA_SERVER_BATCH, LLAMA_SERVER_UBATCH  # noqa: F401
from lablib.engines.servers.process import KILLED_EXIT_S, RunningServer, changed_steps, free_port, start_server  # noqa: F401
from lablib.engines.servers.proxy import start_buffering_proxy  # noqa: F401
from lablib.engines.servers.registry import (  # noqa: F401
    ADAPTER_SERVERS,
    ALIAS_OPTIONS,
    ALIASES,
    SERVERS,
    SPECULATION,
    canonical_server,
    check_adapters,
    server_command,
    server_options,
    speculation_methods,
    speculation_options,
)
from lablib.engines.servers.vllm import (  # noqa: F401
    VLLM_BLOCK_TOKENS,
    VLLM_LORA_RANKS,
    VLLM_MAX_LORA_RANK,
    vllm_block_bytes,
    vllm_dtype,
    vllm_kv_groups,
    vllm_kv_space_gib,
    vllm_lora_args,
    vllm_request_blocks,
)
