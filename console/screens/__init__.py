"""Screens: the main fleet view, node detail, and modals."""
