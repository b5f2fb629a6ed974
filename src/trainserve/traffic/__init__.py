"""Captured traffic: sampled Predict calls as TF Serving's own `PredictionLog` records in TFRecord files.

serve-local (`logging_config` in its model config) and the `trainserve capture` proxy write them through
`writer.TrafficWriter`; replay, drift and export read them. No TensorFlow here: the proxy runs in the light image.
"""
