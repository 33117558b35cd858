"""tests/integration needs a running vLLM: `make test-vllm` starts one and sets PAGEDECK_VLLM_URL.

Without it nothing here is collected (so plain `make test` neither runs nor "passes" these tests, and
`pytest tests/integration` alone reports that no tests ran instead of passing).
"""
from engine import envs

collect_ignore_glob = [] if envs.PAGEDECK_VLLM_URL else ["test_*.py"]
