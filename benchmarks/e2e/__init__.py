"""End-to-end harness: real vLLM 0.33 engines on tiny DSA models, our backend against vLLM's own sparse backends.

Runs on a CUDA GPU with vLLM installed (on the offline GPU machine: ``../shared/tools/vllm-offline``); the pure-Python
parts (model configs, weights, comparisons, the results schema) are tested on the CPU (``tests/e2e``). Entry point:
``python -m e2e {correctness,serving,soak,merge,tables}`` from ``benchmarks/`` (see ``benchmarks/e2e/README.md``).
"""
