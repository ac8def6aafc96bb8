"""How much memory this machine has: physical, and available now (Linux MemAvailable). A core
helper: --max-memory's default (trtq.calib.collect.budget), the batch size check (trtq.data.batcher) and the
--override-input-shape check (trtq.input_override) read it."""

from typing import Optional


def physical_memory() -> Optional[int]:
    """Physical memory of this machine in bytes, None when the OS does not say."""
    import os

    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def available_memory() -> Optional[int]:
    """MemAvailable of /proc/meminfo (Linux), else physical memory, else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return physical_memory()
