"""Tests of engine/: each module is named after the engine module it checks."""
