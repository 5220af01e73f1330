"""The emulator core: virtual world, capture, cost models, execution graph, replay, memory.

It imports neither `prismbench` nor `workloads`: it runs whatever workload it is handed.
"""
