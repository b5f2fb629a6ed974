"""`trainserve proxy`: a pass-through in front of the real TF Serving that writes sampled Predict calls as
PredictionLog records (trainserve.traffic), for servers that log nothing themselves. No TensorFlow: it runs in the
light image. Shared code, no stage: it forwards to whatever serves TF Serving's API."""
