"""Integrations of dloader with launchers and frameworks (torchrun elastic, ...)."""
