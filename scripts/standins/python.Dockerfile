# STAND-IN for python:3.11-slim-bookworm (tests only): Debian's python3 with a venv first on PATH,
# so `pip install` behaves as in the official image.
ARG STANDIN=trainserve-standin
FROM ${STANDIN}/debian:bookworm
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
