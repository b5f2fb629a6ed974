# STAND-IN for tensorflow/serving:<v> (tests only): `tensorflow_model_server` is trainserve's serve-local,
# which takes the same flags. Like the real image: bash present, no curl, no USER line.
ARG STANDIN=trainserve-standin
ARG TF_VERSION=2.21.0
FROM ${STANDIN}/tensorflow:${TF_VERSION}-gpu
# The rest of serve-local's locked dependencies (the base has TensorFlow and its own), as this environment
# installed them (site/ in the context), then trainserve's source: serve-local runs as `python -m trainserve`.
COPY site/ /opt/venv/lib/python3.11/site-packages/
COPY src/trainserve /opt/venv/lib/python3.11/site-packages/trainserve
RUN printf '#!/bin/bash\nexec python -m trainserve serve-local "$@"\n' >/usr/bin/tensorflow_model_server \
    && chmod 0755 /usr/bin/tensorflow_model_server \
    && MPLCONFIGDIR=/tmp/matplotlib python -c "import trainserve.serving.server, tensorflow_serving.apis"
ENV MODEL_BASE_PATH=/models MODEL_NAME=model MPLCONFIGDIR=/tmp/matplotlib
EXPOSE 8500 8501
