"""trainserve: train a Keras model on GPUs, serve it on CPUs with TensorFlow Serving, prove it works.

One subpackage per stage, each running in its own image: `training` (train-gpu), `serving` (serve-local,
the stand-in for tensorflow_model_server) and `evaluation` (eval). They share only the top-level modules,
above all `layout`, the model-directory contract that training writes and the others read.
"""

__version__ = "0.1.0"
