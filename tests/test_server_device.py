"""What a server computes on, read from what it says: llama.cpp's own log lines, in the formats of its
source (common/common.cpp ``common_params_print_info``: ``"  - %-8s: %s (%zu MiB, %zu MiB free)"``;
src/llama-model.cpp ``load_tensors``: ``"%12s model buffer size = %8.2f MiB"`` and ``"offloaded %d/%d
layers to GPU"``). The CPU case is also checked on real servers (test_llama_server, test_servers)."""

from lablib.engines.servers.device import llama_log_device, llama_log_flash_attn, server_device
from lablib.machine.identity import hardware_info

# the lines a CUDA llama-server prints at -lv 4 (the format strings above, values of an H200 machine)
CUDA_LOG = """\
0.00.003.666 I cmn  common_param: common_params_print_info: build 1 (0c1e570) with GNU 12.2.0 for Linux x86_64
0.00.003.667 I cmn  common_param: device_info:
0.00.003.680 I cmn  common_param:   - CUDA0   : NVIDIA H200 (143771 MiB, 142913 MiB free)
0.00.003.682 I cmn  common_param:   - CPU     : Intel(R) Xeon(R) Platinum 8480+ (2015000 MiB, 1990000 MiB free)
0.00.003.795 I cmn  common_param: system_info: n_threads = 16 (n_threads_batch = 16) / 32 | CUDA : ARCHS = 900 |
0.00.384.700 I load_tensors: offloaded 31/31 layers to GPU
0.00.384.702 I load_tensors:   CPU_Mapped model buffer size =    10.10 MiB
0.00.384.703 I load_tensors:        CUDA0 model buffer size =    92.10 MiB
"""
# the same build told to keep every layer on the CPU (-ngl 0): a GPU listed, no weights on it
CPU_ONLY = CUDA_LOG.replace("offloaded 31/31", "offloaded 0/31").replace(
    "       CUDA0 model buffer size =    92.10 MiB", "  CPU_Mapped model buffer size =    92.10 MiB"
)


def test_a_cuda_llama_server_names_its_gpu():
    d = llama_log_device(CUDA_LOG)
    assert d == {
        "device": "cuda",
        "device_name": "NVIDIA H200, 140 GiB, 31/31 layers",
        "device_source": "its log (llama.cpp)",
    }


def test_weights_on_the_cpu_name_the_cpu_and_its_threads_even_beside_a_gpu():
    d = llama_log_device(CPU_ONLY)
    assert d["device"] == "cpu" and d["device_name"] == "Intel(R) Xeon(R) Platinum 8480+, 16 threads"


def test_a_log_without_weights_says_unknown_rather_than_guess():
    assert llama_log_device("server is starting\n") is None
    d = server_device("llama-server", {"threads": 2}, "server is starting\n")
    assert d["device"] == "unknown" and d["device_name"] == "unknown"


def test_servers_the_lab_starts_on_the_cpu_here():
    cpu = hardware_info()["cpu_model"]
    assert server_device("transformers", {"threads": 2}) == {
        "device": "cpu",
        "device_name": f"{cpu}, 2 threads",
        "device_source": "started with --device cpu",
    }
    assert server_device("vllm", {"threads": 1})["device_name"] == f"{cpu}, 1 thread"  # the CPU build: no build key
    assert server_device("vllm", {"threads": 2, "build": "cpu"})["device"] == "cpu"


# what llama-server (-fa auto, its default) and llama-cpp-python's server (flash_attn=False, its default) logged
# here, and llama.cpp's line for a device without the fused kernel (src/llama-context.cpp, resolve_fused_ops)
LLAMA_SERVER_FA = """\
0.00.156.054 I llama_context: flash_attn            = auto
0.00.176.789 I resolve_fused_ops: Flash Attention enabled
"""
LLAMA_CPP_PYTHON_FA = "llama_context: flash_attn            = disabled\n"


def test_a_llama_servers_attention_kernel_as_its_log_says():
    assert llama_log_flash_attn(LLAMA_SERVER_FA) is True
    assert llama_log_flash_attn(LLAMA_CPP_PYTHON_FA) is False
    unsupported = LLAMA_SERVER_FA.replace("Flash Attention enabled", "Flash Attention not supported, set to disabled")
    assert llama_log_flash_attn(unsupported) is False
    assert llama_log_flash_attn("llama_context: flash_attn            = auto\n") is None  # not yet resolved
    assert llama_log_flash_attn("server is starting\n") is None
    # earlier llama.cpp said it so (llama_context's constructor)
    assert llama_log_flash_attn("llama_context: Flash Attention was auto, set to enabled\n") is True
    assert llama_log_flash_attn("llama_context: Flash Attention was auto, set to disabled\n") is False
