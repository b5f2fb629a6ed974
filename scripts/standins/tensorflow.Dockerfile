# STAND-IN for tensorflow/tensorflow:<v>-gpu (tests only): the same TensorFlow version, CPU build, with what it
# requires. build.sh sends the packages as this environment installed them from uv.lock (the same wheels, with
# the byte code its imports wrote; site/ in the context), instead of downloading 1.5 GB again. The train-gpu
# image built on it checks the TensorFlow version, as on the real base.
ARG STANDIN=trainserve-standin
FROM ${STANDIN}/python:3.11-slim
COPY site/ /opt/venv/lib/python3.11/site-packages/
