# STAND-IN for tensorflow/tensorflow:<v>-gpu (tests only): the same TensorFlow version, CPU build.
FROM trainserve-standin/python:3.11-slim
ARG TF_VERSION
RUN pip install --no-cache-dir "tensorflow-cpu==${TF_VERSION}"
