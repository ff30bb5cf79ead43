"""MLflow sink: a run in a local MLflow store inside the run directory (no server).

The store is sqlite, RUN_DIR/mlflow.db (MLflow 3 deprecates its file store), artifacts under
RUN_DIR/mlflow-artifacts; look at it with `mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db`.
Options: experiment (default 'traingym'), run_name (default the run folder's name),
tracking_uri (another store or server, e.g. 'http://127.0.0.1:5000'). The resolved config is
logged as the run's params (flattened, dotted keys), each step's numbers as metrics at that
step. Needs mlflow-skinny, sqlalchemy and alembic (extra `mlflow`).

Not covered: resuming the same MLflow run on `--resume` (a resumed run starts a new one).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def _flat(d: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = str(v)[:6000]  # MLflow's limit on a param value
    return out


class MlflowSink:
    requires = ("mlflow", "sqlalchemy", "alembic")
    extra = "mlflow"
    options = ("experiment", "run_name", "tracking_uri")

    def open(self, run_dir: Path, config: dict[str, Any], options: dict[str, Any]) -> None:
        import logging

        from mlflow.entities import Param

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its store set-up INFO lines
        from mlflow.tracking import MlflowClient

        run_dir = Path(run_dir).resolve()
        uri = options.get("tracking_uri", f"sqlite:///{run_dir / 'mlflow.db'}")
        self.client = MlflowClient(tracking_uri=uri)
        name = options.get("experiment", "traingym")
        exp = self.client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(
            name, artifact_location=(run_dir / "mlflow-artifacts").as_uri())
        run = self.client.create_run(exp_id, run_name=options.get("run_name", run_dir.name))
        self.run_id = run.info.run_id
        params = [Param(k, v) for k, v in _flat(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, step: int, record: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in record.items()]
        for i in range(0, len(metrics), 1000):  # MLflow's batch limit
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
