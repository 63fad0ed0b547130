"""Training-framework integrations. Never imported by vramscope/__init__.py."""
