"""Tests of tools/: the developer tools run, and what they simulate is shaped like the real thing."""
