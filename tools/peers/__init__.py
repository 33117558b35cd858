"""Servers pagedeck runs beside or against: vllm_server (`make test-vllm`: a real vLLM, CPU build, serving the
default model for tests/integration) and fake_hub (`python -m tools.peers.fake_hub`: a local stand-in for the
Hugging Face Hub's HTTP API, for Discover's tests and screenshots). Both are commands.
"""
