"""Feast definitions of the fraud features; Feast imports every module here but this one."""
