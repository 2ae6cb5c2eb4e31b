"""Models built locally: chat templates and tiny Qwen2-architecture models."""
