"""Production traffic as TF Serving's own `PredictionLog` records in TFRecord files: written by capture (serve-local's
`logging_config`, `trainserve proxy`), read back (reader) by replay, drift and export. Shared code: no stage."""
