"""Shims over private or drifting JAX APIs, each isolated here with a test."""
