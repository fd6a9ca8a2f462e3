"""Trajectory stores: one row per denoising step of one block, in a resumable, verifiable Zarr v3 store.

``create_store`` / ``ShardWriter`` write (one shard group per process), ``StoreReader`` reads all shards of a
block length as one dataset, ``store_info`` / ``verify_store`` summarise and check. Layout: ``store.py``.
"""
from .schema import PCA_DIM, SCHEMA_VERSION, row_array_specs, traj_array_specs
from .store import (ShardWriter, StoreError, StoreReader, create_store, open_store, store_info,
                    verify_store)

__all__ = ["PCA_DIM", "SCHEMA_VERSION", "row_array_specs", "traj_array_specs", "ShardWriter", "StoreError",
           "StoreReader", "create_store", "open_store", "store_info", "verify_store"]
