"""The local backend: EngineService runs every chat's replies on one in-process generator."""
