"""Serving stage (serve-local, the stand-in for tensorflow_model_server).

config (flags, config files) -> manager (which versions are loaded) -> servables (what requests call)
-> grpc_api / rest_api (+ metrics) -> server (the lifecycle that ties them together).
"""
