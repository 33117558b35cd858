"""Developer tools, run from a checkout as `python -m tools.NAME`: kernel benchmarks and compile checks, the KV
quant-error measurement, the sampler and LoRA cost benchmarks, the dashboard and server benchmarks, README
screenshots, the loop count of the chats' defaults (loop_check), random-weight GGUFs of real shapes (synthetic_gguf), the demo adapters' training (train_lora) and
the real-vLLM test runner. Two are helper modules for tools and tests rather than commands: logits (a whole
sequence's logits in one forward, the oracle tests compare the generator with) and ggml_writers (GGUF block
writers for test files).

Nothing in the library (engine, kernels, app) imports them; they use the library's public pieces freely.
"""
