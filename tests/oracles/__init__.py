"""Peers the tests compare pagedeck with, used only by tests: llamacpp_peer (llama.cpp through llama-cpp-python,
in a process of its own: its quantizer, teacher-forced logits and tokenization; also a command,
`python -m tests.oracles.llamacpp_peer JOBS.json RESULTS.json`, which is how the tests run it)."""
