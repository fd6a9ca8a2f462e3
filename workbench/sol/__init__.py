"""Speed-of-light (SOL) analysis of diffusion decoding (NLD §4.1): serial target, greedy acceptance,
recursive dynamic compaction, and the confidence policy's gap, block by block."""
