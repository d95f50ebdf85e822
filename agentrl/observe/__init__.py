"""Seeing a run: step metrics per environment, their writers, the live and plot panels."""
