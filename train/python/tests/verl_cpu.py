"""A CPU platform for verl 0.9 (it ships CUDA, NPU and ROCm ones only), so
that its FSDP engine runs in one gloo process in the tests. Importing this
module registers it; it must come before verl's engine modules are
imported (they read the platform when loaded)."""

import contextlib
import types

import psutil
import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import set_platform


class _Device(types.SimpleNamespace):
    """torch.cpu where it has the call, a no-op returning 0 otherwise."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(torch.cpu, name, lambda *a, **k: 0)

    def mem_get_info(self, *a, **k):
        vm = psutil.virtual_memory()
        return vm.available, vm.total

    def is_available(self):
        return True


class CPUPlatform(PlatformBase):
    device_name = "cpu"
    vendor_name = "cpu"
    device_module = _Device()

    def is_available(self):
        return True

    def current_device(self):
        return "cpu"

    def device_count(self):
        return 1

    def set_device(self, i):
        pass

    def synchronize(self, i=None):
        pass

    def manual_seed(self, s):
        torch.manual_seed(s)

    def manual_seed_all(self, s):
        torch.manual_seed(s)

    def set_allocator_settings(self, s):
        pass

    def empty_cache(self):
        pass

    def get_device_capability(self, i=0):
        return (None, None)

    def communication_backend_name(self):
        return "gloo"

    def visible_devices_envvar(self):
        return "CPU_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg):
        yield

    def profiler_start(self):
        pass

    def profiler_stop(self):
        pass

    def ray_resource_name(self):
        return "CPU"

    def ray_noset_envvars(self):
        return []

    def is_ipc_supported(self):
        return False

    def cudart(self):
        return None


set_platform(CPUPlatform())
