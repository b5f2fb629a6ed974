"""trainserve: train a Keras model on GPUs, serve it on CPUs with TensorFlow Serving, prove it works."""

__version__ = "0.1.0"
