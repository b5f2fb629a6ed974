"""Serving stage (serve-local, the stand-in for tensorflow_model_server): config -> manager -> APIs -> server."""
