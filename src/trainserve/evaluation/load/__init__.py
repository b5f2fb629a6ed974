"""Load testing: a served model's capacity (throughput and latency percentiles over concurrency and request
rate), on the same gRPC client core as evaluation. `trainserve load` runs a sweep (sweep.py) of points, each
measured until stable (measure.py), and writes the report (report.py); its options are config.py."""
