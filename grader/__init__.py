"""The instructor's side of the distlab course: release, autograde, feedback, export (see README.md)."""
