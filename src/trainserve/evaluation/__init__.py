"""Evaluation stage (the eval image): data -> gRPC client -> batched run -> report."""
