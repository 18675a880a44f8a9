"""The host scan: local accelerators (TPU sysfs, NVML), port owners."""
