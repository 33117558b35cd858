"""Developer tools, run from a checkout as `python -m tools.NAME`: kernel benchmarks and compile checks, the KV
quant-error measurement, the sampler and LoRA cost benchmarks, the dashboard benchmark and README screenshots.

Nothing in the library (engine, kernels, app) imports them; they use the library's public pieces freely.
"""
