"""Discover: find models on the Hugging Face Hub and download them into its cache (hub, download: Qt-free)."""
