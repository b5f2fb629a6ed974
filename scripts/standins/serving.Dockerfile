# STAND-IN for tensorflow/serving:<v> (tests only): `tensorflow_model_server` is trainserve's serve-local,
# which takes the same flags. Like the real image: bash present, no curl, no USER line.
ARG TF_VERSION=2.21.0
FROM trainserve-standin/tensorflow:${TF_VERSION}-gpu
ARG TF_VERSION
# The locked serve-local dependencies (the base already has the same tensorflow-cpu), then trainserve itself.
COPY requirements/serve.txt /opt/trainserve/requirements.txt
RUN pip install --no-cache-dir --no-deps --require-hashes -r /opt/trainserve/requirements.txt
COPY pyproject.toml README.md /opt/trainserve/
COPY src /opt/trainserve/src
RUN pip install --no-cache-dir --no-deps /opt/trainserve \
    && printf '#!/bin/bash\nexec trainserve serve-local "$@"\n' >/usr/bin/tensorflow_model_server \
    && chmod 0755 /usr/bin/tensorflow_model_server
ENV MODEL_BASE_PATH=/models MODEL_NAME=model MPLCONFIGDIR=/tmp/matplotlib
EXPOSE 8500 8501
