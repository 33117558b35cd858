"""Developer tools, run from a checkout as `python -m tools.PACKAGE.NAME`, grouped by purpose:

- tools.bench: benchmarks and measurements (kernels, decode steps, servers, memory, quality, loops, compiles);
- tools.screenshots: the README's and the docs' screenshots, taken of the real window;
- tools.models: model files the tests, benchmarks and demos use (synthetic GGUFs, VLM and mmproj GGUFs, the demo
  LoRA adapters);
- tools.peers: servers pagedeck is run beside or against (a real vLLM, a local Hugging Face Hub stand-in).

The modules directly in tools/ are helpers shared by several of those packages and by the tests, not commands:
logits (a whole sequence's logits in one forward, what tests and train_lora compare with), ggml_writers (ggml
block writers for the GGUFs tests and synthetic_gguf make), processes (starting and stopping servers) and
simulated_workload (dashboard snapshots without an engine). Inside a package, a module whose name starts with an
underscore is a helper of that package's commands; every other module is a command with a --help.

Nothing in the library (engine, kernels, app) imports them; they use the library's public pieces freely.
"""
