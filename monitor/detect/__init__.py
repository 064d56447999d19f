"""Regression detection: robust statistics (`stats`), the pure detector and its state (`detector`),
replaying recorded histories through it (`replay`), exporting the stored history (`export`) and the
`replay` command (`cli`). See docs/detection.md.
"""
