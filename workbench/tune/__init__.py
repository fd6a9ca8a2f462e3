"""Optuna studies: decoding-threshold sweeps (multi-objective TPF × accuracy) and sampler hyper-parameters."""
