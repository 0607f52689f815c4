"""verl 0.9.1 on a CPU, for the tests: its real Ray worker group, actor worker and FSDP2 engine,
with the few gaps a machine without a GPU leaves bridged here (each with one line saying why).

verl picks a device through its platform plugin registry and finds only CUDA, NPU and ROCm
platforms; without one that matches it falls back to CUDA and fails at the first CUDA call.
`PlatformCPU` below is a platform like those, registered through verl's own
`PlatformRegistry.register`, and chosen with `VERL_PLATFORM=cpu`. Every Ray worker process
registers it too: `VERL_USE_EXTERNAL_MODULES` makes `import verl` import this module there.

What stays a GPU's: rollout (verl registers only vLLM, SGLang and TensorRT-LLM servers), hence
`fit()` end to end; FSDP1 (`sync_module_states=True` needs GPU parameters); NCCL. The trainer's
`_update_actor` does not need any of them.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Optional

import torch

ROOT = Path(__file__).resolve().parents[2]  # the repository root: verl_bridge/ is importable from it
THIS_MODULE = "verl_bridge.tests.cpu_verl"

# Set before verl is imported here, and inherited by the Ray workers started from this process.
os.environ.setdefault("VERL_PLATFORM", "cpu")  # verl's own override of its device detection
os.environ.setdefault("VERL_USE_EXTERNAL_MODULES", THIS_MODULE)  # each `import verl` registers PlatformCPU
# verl registers its FSDP engines for the devices "cuda" and "npu" only; their code runs on
# whatever device the platform names, so the cuda entry serves the CPU.
os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # tokenizers would warn after Ray forks
if str(ROOT) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):  # the workers import this module
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from verl.plugin.platform import PlatformBase, PlatformRegistry  # noqa: E402


def _zero(*args, **kwargs) -> int:
    return 0


# torch.cpu has no memory statistics and no memory cap; verl's memory logging asks the device
# module for them (zeros here), and its cap is a no-op.
_CPU_MEMORY_CALLS = {name: _zero for name in (
    "memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
    "reset_peak_memory_stats", "empty_cache", "set_per_process_memory_fraction")}


class _CpuDeviceModule(SimpleNamespace):
    """torch.cpu, plus what verl reads from a device module that torch.cpu lacks."""

    def __getattr__(self, name: str):
        return getattr(torch.cpu, name)

    def mem_get_info(self, *args, **kwargs) -> tuple[int, int]:
        return 0, 0

    def get_device_name(self, *args, **kwargs) -> str:
        return "CPU"  # verl's MFU table has no CPU: its figure reads 0


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """The CPU as verl's device: torch's "cpu" device, the gloo backend, no accelerator in Ray."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _CpuDeviceModule(**_CPU_MEMORY_CALLS)

    def is_available(self) -> bool:
        return True

    def current_device(self) -> str:
        return "cpu"  # verl passes it to .to(device=...), where an index would mean an accelerator

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # read, never set: no device is ever assigned to a Ray actor here

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # asked for only when a pool has use_gpu=True; the tests' pool has use_gpu=False

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


# ------------------------------------------------------------------ the actor worker
def actor_worker_class():
    """verl's own actor worker (`ActorRolloutRefWorker`, role "actor"), opening the process group
    itself first. (Imported here, not at the top: the worker module is heavy, and a worker process
    imports this module through verl's own __init__, before verl has finished loading.)"""
    import torch.distributed as dist
    from verl.workers.engine_workers import ActorRolloutRefWorker

    class CpuActorWorker(ActorRolloutRefWorker):
        def __init__(self, *args, **kwargs):
            # verl would open "cpu:gloo,cpu:gloo" (its CPU backend, then the device's), which torch
            # rejects as a duplicate; a group already open is kept as it is.
            if not dist.is_initialized():
                dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                                        world_size=int(os.environ["WORLD_SIZE"]))
            super().__init__(*args, **kwargs)

    return CpuActorWorker


def start_ray(num_cpus: int = 1) -> None:
    """A local Ray, no dashboard (~7 s on 2 cores); the environment above is passed on to workers."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {k: os.environ[k] for k in (
                     "VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES", "VERL_ENGINE_DEVICE", "PYTHONPATH",
                     "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS") if k in os.environ}})


def actor_worker_group(config, world_size: int = 1):
    """A RayWorkerGroup of `world_size` CPU processes, each verl's actor worker over its FSDP2
    engine, with the model built (`init_model`). config: the `actor_rollout_ref` section."""
    import ray
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    # ResourcePoolManager hard-codes use_gpu=True; a pool of our own asks Ray for CPUs only,
    # one a process (max_colocate_count=1, the CPUs ray.init was given).
    pool = RayResourcePool(process_on_nodes=[world_size], use_gpu=False, max_colocate_count=1)
    worker = RayClassWithInitArgs(cls=ray.remote(actor_worker_class()), config=config, role="actor")
    group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=worker, device_name="cpu")
    group.init_model()
    return group
