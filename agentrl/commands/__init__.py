"""Subcommands of the ``agentrl`` CLI, one module each."""
