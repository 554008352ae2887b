"""The device's energy counter, read around each timed batch and over each load point's span (runner/session.py):
the joules a batch spent are the difference of two readings.

On a CUDA device it is NVML's total energy counter (nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver
loaded, Volta and later), read with nvidia-ml-py, NVIDIA's own binding: one wheel without dependencies. Zeus, which the
ML.ENERGY leaderboard measures with, reads this same counter through the same binding; its windows add nothing a
difference of two readings does not give, and would bring its own dependencies. On a CPU it is Linux RAPL (powercap's
intel-rapl:N package zones, which AMD's recent kernels expose under the same name), read from sysfs; its counters
wrap at max_energy_range_uj, and are often readable by root only. Where there is no counter the meter reads None and
`why` says why. Either counter is the whole device's: another process's work on it in a batch counts too.
"""
from __future__ import annotations

import glob
import os
import re

POWERCAP = "/sys/class/powercap"


class EnergyMeter:
    """read() -> the counter in joules (monotonic, its wraps undone), or None where there is none (`why`)."""

    def __init__(self, device=None, powercap: str = POWERCAP):
        self.why: str | None = None
        self._read = None
        kind = getattr(device, "type", device)
        if kind == "cuda":
            self._read = self._nvml(device)
        elif kind == "cpu":
            self._read = self._rapl(powercap)
        else:
            self.why = f"no energy counter is read on a {kind} device"

    @property
    def available(self) -> bool:
        return self._read is not None

    def read(self) -> float | None:
        if self._read is None:
            return None
        try:
            return self._read()
        except (OSError, ValueError) as error:  # a counter that stops answering mid-run: none from then on
            self.why, self._read = f"the energy counter stopped answering ({type(error).__name__}: {error})", None
            return None

    def spent(self, before: float | None) -> float | None:
        """Joules since a reading (None: none)."""
        after = self.read()
        return None if before is None or after is None else after - before

    # -- CUDA -------------------------------------------------------------------------------------
    def _nvml(self, device):
        try:
            import pynvml
        except ImportError:
            self.why = "nvidia-ml-py is not installed (pip install nvidia-ml-py): no energy counter is read"
            return None
        try:
            pynvml.nvmlInit()
            handle = _nvml_handle(pynvml, device)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except pynvml.NVMLError as error:
            self.why = f"NVML gives no energy counter for this GPU ({error}; it needs a Volta or later GPU)"
            return None
        return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0

    # -- CPU --------------------------------------------------------------------------------------
    def _rapl(self, powercap: str):
        # the package zones (intel-rapl:0, :1, ...); their subzones (intel-rapl:0:0) are inside them
        zones = sorted(z for z in glob.glob(os.path.join(powercap, "intel-rapl:*"))
                       if re.fullmatch(r"intel-rapl:\d+", os.path.basename(z)))
        if not zones:
            self.why = f"this kernel exposes no RAPL energy counter ({powercap}/intel-rapl:*: none)"
            return None
        counters = []
        for zone in zones:
            try:
                counters.append(_RaplZone(zone))
            except (OSError, ValueError) as error:
                self.why = (f"the RAPL energy counter is not readable ({zone}/energy_uj: {type(error).__name__}; "
                            "often root only)")
                return None
        return lambda: sum(c.read() for c in counters)


class _RaplZone:
    """One RAPL zone's counter in joules, its wraps at max_energy_range_uj undone (reads are seconds apart, a wrap
    minutes at full power)."""

    def __init__(self, zone: str):
        self.path = os.path.join(zone, "energy_uj")
        with open(os.path.join(zone, "max_energy_range_uj")) as f:
            self.range_uj = int(f.read())
        self.last = self._raw()
        self.wraps = 0

    def _raw(self) -> int:
        with open(self.path) as f:
            return int(f.read())

    def read(self) -> float:
        raw = self._raw()
        if raw < self.last:
            self.wraps += 1
        self.last = raw
        return (raw + self.wraps * self.range_uj) / 1e6


def _nvml_handle(pynvml, device):
    """The NVML handle of a torch CUDA device: by its UUID (NVML numbers every GPU, torch those CUDA_VISIBLE_DEVICES
    leaves), else by its index."""
    import torch

    index = device.index if getattr(device, "index", None) is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except pynvml.NVMLError:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(index)
