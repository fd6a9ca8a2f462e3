"""Lightning training runs (one module per model kind)."""
