"""Prometheus metrics on an injected registry, and the HTTP server that exposes them."""
