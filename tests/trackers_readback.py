"""Each tracker's metrics of a training run folder, read back by the tracker's own reader, as ``{metric: {step:
value}}`` to compare with ``metrics.csv``:

* CSV: pandas on ``logs/version_0/metrics.csv``;
* TensorBoard: ``EventAccumulator`` on ``tb/version_0`` (every events file of every start, orphaned steps of an
  interrupted start purged as TensorBoard purges them);
* MLflow: ``MlflowClient.get_metric_history`` on the run id of ``trackers.json``;
* W&B: the offline run files ``wandb/offline-run-*-<id>/run-<id>.wandb``, each a LevelDB-style log of W&B's
  protobuf ``Record`` messages (``wandb.proto.wandb_internal_pb2``); W&B 0.2x+ reads them in its Go core only, so
  the log framing (7-byte header ``:W&B`` + magic + version, 32 KiB blocks of records with a CRC-32, a length
  and a type) is read here and every record decoded with W&B's own message class. A history record's step is
  its ``trainer/global_step`` item (Lightning's step axis for W&B).
"""
import json
import math
import struct
import zlib
from pathlib import Path


def csv_metrics(out: Path) -> dict:
    import pandas as pd

    df = pd.read_csv(out / "logs" / "version_0" / "metrics.csv")
    got: dict = {}
    for _, row in df.iterrows():
        for k, v in row.items():
            if k != "step" and not (isinstance(v, float) and math.isnan(v)):
                got.setdefault(k, {})[int(row["step"])] = float(v)
    return got


def tensorboard_metrics(out: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tb" / "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: float(e.value) for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def mlflow_metrics(out: Path) -> tuple[dict, dict]:
    """``(metrics, params)`` of the run folder's MLflow run."""
    from mlflow.tracking import MlflowClient

    rec = json.loads((out / "trackers.json").read_text())["mlflow"]
    client = MlflowClient(rec["tracking_uri"])
    run = client.get_run(rec["run_id"])
    got = {k: {m.step: m.value for m in client.get_metric_history(rec["run_id"], k)} for k in run.data.metrics}
    return got, dict(run.data.params)


_HEADER = struct.Struct("<4sHB")          # ident ":W&B", magic 0xBEE1, version
_RECORD = struct.Struct("<IHB")           # crc32, length, type
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_records(path: Path):
    """The protobuf ``Record`` messages of one ``.wandb`` file, in order (CRC-checked)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, version = _HEADER.unpack_from(data, 0)
    assert ident == b":W&B" and magic == 0xBEE1, (ident, magic)
    pos, pending = _HEADER.size, b""
    while pos + _RECORD.size <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _RECORD.size:                       # the block's trailer: zero padding
            pos += left
            continue
        crc, length, kind = _RECORD.unpack_from(data, pos)
        if length == 0 and kind == 0:                 # zero padding (a block's end, or the file's)
            pos += left
            continue
        chunk = data[pos + _RECORD.size: pos + _RECORD.size + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc, f"bad CRC at {pos} in {path}"
        pos += _RECORD.size + length
        pending = chunk if kind in (_FULL, _FIRST) else pending + chunk
        if kind in (_FULL, _LAST):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pending)
            yield rec


def wandb_metrics(out: Path) -> tuple[dict, set, dict]:
    """``(metrics by trainer/global_step, the run ids seen, the config)`` of every offline run file of the run
    folder's W&B run."""
    rec = json.loads((out / "trackers.json").read_text())["wandb"]
    got, ids, config = {}, set(), {}
    files = sorted((out / "wandb").glob(f"offline-run-*-{rec['id']}/run-{rec['id']}.wandb"))
    assert files, f"no offline W&B run files for run {rec['id']} in {out / 'wandb'}"
    for f in files:
        for r in wandb_records(f):
            which = r.WhichOneof("record_type")
            if which == "run":
                ids.add(r.run.run_id)
            elif which == "config":
                for item in r.config.update:
                    config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
            elif which == "history":
                items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
                step = items.get("trainer/global_step")
                for k, v in items.items():
                    if not k.startswith("_") and k != "trainer/global_step" and isinstance(v, (int, float)):
                        got.setdefault(k, {})[int(step)] = float(v)
    return got, ids, config


def assert_same_metrics(reference: dict, other: dict, who: str, rel: float = 1e-6) -> None:
    """``other`` holds exactly ``reference``'s metrics, steps and values (float32 round-off allowed)."""
    assert set(other) == set(reference), f"{who}: metrics {sorted(set(other) ^ set(reference))} differ"
    for k, series in reference.items():
        assert set(other[k]) == set(series), f"{who}: {k} steps {sorted(other[k])} vs csv {sorted(series)}"
        for step, v in series.items():
            assert math.isclose(other[k][step], v, rel_tol=rel, abs_tol=1e-12), (who, k, step, other[k][step], v)
