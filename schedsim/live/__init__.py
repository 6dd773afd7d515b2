"""Live serving: the same policy objects driving real engines, and validation of
predictions against live runs."""
