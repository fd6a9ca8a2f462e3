"""The trajectory store schema: array names, trailing shapes and dtypes (DESIGN.md, "Trajectories and the Zarr store").

One **row** is one denoising step of one trajectory (one block decoded under a policy); ``B`` is the block length.
Row arrays have a leading dimension ``N`` (rows), trajectory arrays a leading dimension ``T`` (trajectories).
Bump :data:`SCHEMA_VERSION` whenever a name, shape, dtype or meaning below changes.
"""
from __future__ import annotations

import numpy as np

SCHEMA_VERSION = 2
"""2: ``top_probs`` float32 (was float16 in 1, whose rounding moved probabilities within 2.4e-4 of a threshold τ
across it, so a stored state could disagree with the decoder's own commit decision)."""
PCA_DIM = 44  # columns of the ``token_pca`` array: PCA of the model's token embeddings, (V, 44) float16

# Commit-record bookkeeping: the shard group's ``items`` array, (n_items, 3) int64, one row per work item in
# append order with these columns (ends are shard-local and exclusive).
ITEM_COLUMNS = ("item_id", "traj_end", "row_end")


def row_array_specs(B: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Per-row arrays: ``name -> (trailing shape, dtype)``; stored shape is ``(N, *trailing)``.

    - ``top_ids`` (B, 3) int32: the model's top-3 token ids at each block position;
    - ``top_probs`` (B, 3) float32: their probabilities (0..1), in the precision the decoder compared with τ;
    - ``entropy`` (B,) float16: entropy of the predictive distribution (nats);
    - ``masked`` (B,) bool: the position is still masked at this step;
    - ``label`` (B,) bool: ``top_ids[:, 0] == final id`` of the position (meaningful where ``masked``);
    - ``traj`` () int64: shard-local trajectory index of the row (global in :class:`StoreReader` output);
    - ``step`` () int16: denoising step within the trajectory (0-based).
    """
    return {
        "top_ids": ((B, 3), np.dtype(np.int32)),
        "top_probs": ((B, 3), np.dtype(np.float32)),
        "entropy": ((B,), np.dtype(np.float16)),
        "masked": ((B,), np.dtype(np.bool_)),
        "label": ((B,), np.dtype(np.bool_)),
        "traj": ((), np.dtype(np.int64)),
        "step": ((), np.dtype(np.int16)),
    }


def traj_array_specs(B: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Per-trajectory arrays: ``name -> (trailing shape, dtype)``; stored shape is ``(T, *trailing)``.

    - ``prompt_id`` () int64: id of the prompt the block belongs to;
    - ``category`` () int16: index into the root attribute ``categories`` (list of names);
    - ``block_index`` () int32: index of the block within the generation (0-based);
    - ``final_ids`` (B,) int32: the token ids the policy finally committed in the block;
    - ``row_start``, ``row_end`` () int64: the trajectory's rows, shard-local range ``[start, end)``.
    """
    return {
        "prompt_id": ((), np.dtype(np.int64)),
        "category": ((), np.dtype(np.int16)),
        "block_index": ((), np.dtype(np.int32)),
        "final_ids": ((B,), np.dtype(np.int32)),
        "row_start": ((), np.dtype(np.int64)),
        "row_end": ((), np.dtype(np.int64)),
    }


def row_nbytes(B: int) -> int:
    """Uncompressed bytes of one row at block length ``B`` (906 at B = 32)."""
    return sum(int(np.prod(s, dtype=np.int64)) * d.itemsize for s, d in row_array_specs(B).values())
