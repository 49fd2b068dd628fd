"""tacc: development and profiling stack for the tacc PCIe ML inference accelerator."""

__version__ = "0.1.0"
