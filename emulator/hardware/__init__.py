"""Hardware presets (GPUs, intra-node links, inter-node networks) and their loader.

The data lives in one TOML file per machine beside this module; see `presets.py` for the
meaning of each field and the bandwidth conventions.
"""

from emulator.hardware.presets import (
    ARCH_OF_COMPUTE_CAPABILITY,
    DTYPES,
    GPU_NAMES,
    LINK_NAMES,
    NETWORK_NAMES,
    GpuPreset,
    LinkPreset,
    NetworkPreset,
    gpu_preset,
    gpu_presets_matching,
    inter_node_network,
    intra_node_link,
)

__all__ = [
    "ARCH_OF_COMPUTE_CAPABILITY",
    "DTYPES",
    "GPU_NAMES",
    "LINK_NAMES",
    "NETWORK_NAMES",
    "GpuPreset",
    "LinkPreset",
    "NetworkPreset",
    "gpu_preset",
    "gpu_presets_matching",
    "inter_node_network",
    "intra_node_link",
]
