"""`python -m engine bench` and `bench-spec`: what users feel (decode speed, concurrency, prefix-cache TTFT,
speculative decoding's crossover), measured beside transformers on the user's own model. Only engine.cli
imports this package (lazily), so the library never loads it. It may import everything below the CLI
except the server (a sibling layer)."""
