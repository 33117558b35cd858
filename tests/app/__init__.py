"""Tests of app/: real widgets offscreen (pytest-qt), real SQLite, the real engine on a tiny model."""
