"""The run directory's on-disk contract: names, JSONL lines, records, atomic writes, requests,
the knob record, the run's settings and the sinks that mirror metrics (TensorBoard, CSV, W&B)."""
