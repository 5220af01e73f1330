"""PrismBench: emulate LLM training jobs of thousands of GPUs and check the predictions.

The harness and CLI sit here, on top of `emulator` (the core) and `workloads`
(GPT/Llama and their parallel training step).
"""

__version__ = "0.1.0"
