"""Tri-mode language model: attention masks, noising, losses, presets, the wrapper and checkpoint I/O."""
