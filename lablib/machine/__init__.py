"""This machine and what this process may use of it (one package: identity, limits, threads, ceilings).

- :mod:`lablib.machine.identity`: CPU model, accelerators, the manifest's hardware record, load average;
- :mod:`lablib.machine.limits`: container caps, usable CPUs, available memory;
- :mod:`lablib.machine.threads`: the thread policy (LABLIB_THREADS) and contention;
- :mod:`lablib.machine.ceilings`: measured bandwidth and FLOP/s (the roofline's ceilings);
- :mod:`lablib.machine.devices`: GPUs and torch's device/dtype; :mod:`lablib.machine.accelerators`:
  published peaks of machines you do not have.

The names below are re-exported for ``from lablib.machine import hardware_info``; code in the package
imports each from its own module.
"""

from __future__ import annotations

from lablib.machine.ceilings import (  # noqa: F401
    MATMUL_DTYPES,
    MEASUREMENT_VERSION,
    ROOFLINE_KERNEL,
    STREAM_ARRAY_BYTES,
    STREAM_KERNELS,
    cached_measurement,
    matmul_flops,
    measure_machine,
    measured_summary,
    measurement_path,
    stream_bandwidth,
)
from lablib.machine.identity import (  # noqa: F401
    accelerator,
    cpu_model,
    describe,
    found,
    hardware_info,
    load_average,
    machine_id,
    machine_key,
)
from lablib.machine.limits import (  # noqa: F401
    CGROUP_ROOT,
    available_ram_bytes,
    cpu_quota,
    cpus_usable,
    memory_headroom_bytes,
    memory_limit_bytes,
)
from lablib.machine.threads import (  # noqa: F401
    MAX_THREADS_PER_CPU,
    BusyMeter,
    check_threads,
    cpus_busy,
    default_threads,
    threads_beside_others,
)
