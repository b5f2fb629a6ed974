"""`trainserve proxy`: a pass-through in front of the real TF Serving that routes requests addressed to `stable`
(a share to a candidate version, a copy shadowed to it, from a routing file), counts every answer by the version
that gave it, and writes a sampled share of the Predict calls as PredictionLog records (trainserve.traffic), which
tensorflow_model_server does not. No TensorFlow: it runs in the light image. Shared code, no stage: it forwards to
whatever serves TF Serving's API."""
